/*
 * seccomp_echo - a server that locks itself down as OpenSSH's privilege-
 * separated child does, with a harsher filter: after it, any system call
 * but read, write, close and exit kills the process (SIGSYS).
 *
 *   seccomp_echo PORT HEAD OWN [--poll | --libseccomp | --nofile]
 *
 * Accepts one connection on 127.0.0.1:PORT, reads HEAD bytes, writes OWN
 * bytes of a pattern (byte i is i*7 mod 251) the client has not read yet,
 * installs the filter while both directions still hold bytes, then echoes
 * everything until end of file and exits 0.  --poll: waits in poll()
 * before each read (poll is then allowed too), as sshd does.  --libseccomp:
 * the same filter made and loaded with libseccomp (exits 77 when built
 * without it).  --nofile: first RLIMIT_NOFILE of 1, as OpenSSH's sandbox
 * sets it (no descriptor number can be reused after it).  Under smclo
 * the connection must move to TCP before the filter, with no byte lost.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef WITH_LIBSECCOMP
#include <seccomp.h>
#endif

#define ALLOW(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
                  BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

static void lock_down(int with_poll)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		ALLOW(__NR_read), ALLOW(__NR_write), ALLOW(__NR_close),
		ALLOW(__NR_exit), ALLOW(__NR_exit_group),
		ALLOW(with_poll ? __NR_poll : __NR_read),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
		perror("seccomp");
		exit(2);
	}
}

static void lock_down_libseccomp(void)
{
#ifdef WITH_LIBSECCOMP
	static const int allowed[] = { SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(close),
	                               SCMP_SYS(exit), SCMP_SYS(exit_group) };
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
	int rc = ctx ? 0 : -1;

	for (size_t i = 0; rc == 0 && i < sizeof(allowed) / sizeof(allowed[0]); i++)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, allowed[i], 0);
	if (rc == 0)
		rc = seccomp_load(ctx);
	if (rc != 0) {
		fprintf(stderr, "libseccomp: %d\n", rc);
		exit(2);
	}
#else
	exit(77);
#endif
}

static int listen_on(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((unsigned short)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 4) < 0) {
		perror("listen");
		exit(2);
	}
	return l;
}

static void read_exactly(int fd, char *buf, size_t n)
{
	while (n) {
		ssize_t k = read(fd, buf, n);
		if (k <= 0)
			exit(3);
		buf += k;
		n -= (size_t)k;
	}
}

static void write_all(int fd, const char *buf, size_t n)
{
	while (n) {
		ssize_t k = write(fd, buf, n);
		if (k <= 0)
			syscall(__NR_exit_group, 4);
		buf += k;
		n -= (size_t)k;
	}
}

int main(int argc, char **argv)
{
	static char buf[65536];
	int l, fd, with_poll = argc > 4 && strcmp(argv[4], "--poll") == 0;
	int with_lib = argc > 4 && strcmp(argv[4], "--libseccomp") == 0;
	int with_nofile = argc > 4 && strcmp(argv[4], "--nofile") == 0;
	size_t head, own;

	if (argc < 4) {
		fprintf(stderr, "usage: seccomp_echo PORT HEAD OWN [--poll]\n");
		return 2;
	}
	head = strtoul(argv[2], NULL, 10);
	own = strtoul(argv[3], NULL, 10);
	l = listen_on(atoi(argv[1]));
	printf("listening\n");
	fflush(stdout);
	fd = accept(l, NULL, NULL);
	if (fd < 0)
		return 2;
	read_exactly(fd, buf, head < sizeof(buf) ? head : sizeof(buf));
	for (size_t i = 0; i < own;) {
		size_t n = own - i < sizeof(buf) ? own - i : sizeof(buf);
		for (size_t j = 0; j < n; j++)
			buf[j] = (char)((i + j) * 7 % 251);
		write_all(fd, buf, n);
		i += n;
	}
	if (with_nofile && setrlimit(RLIMIT_NOFILE, &(struct rlimit){ 1, 1 }) < 0) {
		perror("setrlimit");
		return 2;
	}
	if (with_lib)
		lock_down_libseccomp();
	else
		lock_down(with_poll);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (with_poll && poll(&p, 1, -1) < 0)
			syscall(__NR_exit_group, 5);
		k = read(fd, buf, sizeof(buf));
		if (k < 0)
			syscall(__NR_exit_group, 6);
		if (k == 0)
			break;
		write_all(fd, buf, (size_t)k);
	}
	close(fd);
	syscall(__NR_exit_group, 0);
	return 0;
}
