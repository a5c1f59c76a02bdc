/*
 * fork_storm.c - forks as fast as it can while its own threads use
 * connections: one blocks in accept() on a listener of the process (which
 * makes it direct: connections without TCP) and echoes a byte per
 * connection, another connects to it in a loop; each fork child makes one
 * connection of its own and exits.
 *
 *   fork_storm SECONDS
 *
 * A fork walks the process's connections while the threads close them; a
 * walk that took a reference on a connection being freed brought it back
 * to be freed twice, and two descriptors then shared one connection: a
 * crash, or both threads stuck in one read (found by a user-style attack,
 * 2026-11-27).  Prints "ok forks=N connected=N shm=N" and exits 0 when
 * every connection echoed its byte and every child finished within 5 s;
 * otherwise says what failed and exits 1.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_in addr = { .sin_family = AF_INET };
static atomic_long connected, shm, errors;
static atomic_int stop;

/* Accelerated: the descriptor is smclo's socket pair (asked of the kernel). */
static int is_shm(int fd)
{
	struct sockaddr_storage a;
	socklen_t l = sizeof(a);

	return syscall(SYS_getsockname, fd, &a, &l) == 0 && a.ss_family == AF_UNIX;
}

static void *acceptor(void *arg)
{
	int lfd = (int)(long)arg;

	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		char b;

		if (fd < 0) {
			if (errno != EINTR)
				atomic_fetch_add(&errors, 1);
			continue;
		}
		if (read(fd, &b, 1) == 1 && write(fd, &b, 1) != 1)
			atomic_fetch_add(&errors, 1);
		close(fd);
	}
	return NULL;
}

/* One connection, one byte there and back: 1 accelerated, 0 TCP, -1 failed. */
static int one_connection(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), s;
	char b = 'x', r = 0;

	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || write(fd, &b, 1) != 1 ||
	    read(fd, &r, 1) != 1 || r != 'x') {
		close(fd);
		return -1;
	}
	s = is_shm(fd);
	close(fd);
	return s;
}

static void *connector(void *arg)
{
	while (!atomic_load(&stop)) {
		int r = one_connection();

		if (r < 0)
			atomic_fetch_add(&errors, 1);
		atomic_fetch_add(&connected, r >= 0);
		atomic_fetch_add(&shm, r > 0);
	}
	return NULL;
}

/* The child's exit status, or -1 when it did not finish within 5 s. */
static int wait_child(pid_t p)
{
	for (int ms = 0; ms < 5000; ms++) {
		int st;

		if (waitpid(p, &st, WNOHANG) == p)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(1000);
	}
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	return -1;
}

int main(int argc, char **argv)
{
	int secs = argc > 1 ? atoi(argv[1]) : 3;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	socklen_t l = sizeof(addr);
	long forks = 0;
	pthread_t t;
	time_t end;

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    listen(lfd, 128) < 0 || getsockname(lfd, (struct sockaddr *)&addr, &l) < 0) {
		perror("fork_storm: listen");
		return 1;
	}
	if (pthread_create(&t, NULL, acceptor, (void *)(long)lfd) ||
	    pthread_create(&t, NULL, connector, NULL)) {
		fprintf(stderr, "fork_storm: cannot start threads\n");
		return 1;
	}
	for (end = time(NULL) + secs; time(NULL) < end; forks++) {
		pid_t p = fork();
		int st;

		if (p < 0) {
			perror("fork_storm: fork");
			return 1;
		}
		if (p == 0)
			_exit(one_connection() < 0);
		if ((st = wait_child(p)) != 0) {
			printf("child %ld %s\n", forks, st < 0 ? "stuck for 5 s" : "failed");
			fflush(stdout);
			_exit(1);
		}
	}
	atomic_store(&stop, 1);
	usleep(200 * 1000);
	printf("%s forks=%ld connected=%ld shm=%ld errors=%ld\n", errors ? "errors" : "ok", forks,
	       (long)connected, (long)shm, (long)errors);
	fflush(stdout);
	_exit(errors ? 1 : 0);
}
