/*
 * failsys - run a program in which some system calls fail, for failure
 * injection tests (tests/py/test_inject.py).
 *
 *   failsys ERRNO SYSCALL[,SYSCALL...] -- PROGRAM [ARGS...]
 *
 * A seccomp filter makes every listed system call fail with ERRNO (a
 * number); "socket_unix" fails socket(AF_UNIX, ...) only, "socket_tcp"
 * socket(AF_INET/AF_INET6, ...) only.  The filter is inherited by children
 * and survives exec, and LD_PRELOAD still works under it (no_new_privs only
 * stops set-ID gains).
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

struct named { const char *name; long nr; int family; };

static const struct named calls[] = {
	{ "memfd_create", SYS_memfd_create, -1 },
	{ "socketpair", SYS_socketpair, -1 },
	{ "socket_unix", SYS_socket, AF_UNIX },
	{ "socket_tcp", SYS_socket, AF_INET },
	{ "mmap", SYS_mmap, -1 },
	{ "accept4", SYS_accept4, -1 },
	{ "sendmsg", SYS_sendmsg, -1 },
	{ "recvmsg", SYS_recvmsg, -1 },
	{ "dup3", SYS_dup3, -1 },
	{ "fcntl", SYS_fcntl, -1 },
	{ "bind", SYS_bind, -1 },
	{ "openat", SYS_openat, -1 },
};

#define MAX_RULES 32

int main(int argc, char **argv)
{
	struct sock_filter f[8 + 6 * MAX_RULES];
	int n = 0, err, rules = 0;
	char *list, *tok, *save;

	if (argc < 5 || strcmp(argv[3], "--")) {
		fprintf(stderr, "usage: failsys ERRNO SYSCALL[,SYSCALL...] -- PROGRAM [ARGS...]\n");
		return 2;
	}
	err = atoi(argv[1]);
	f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
	                                      offsetof(struct seccomp_data, arch));
	f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
	f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	list = strdup(argv[2]);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		const struct named *c = NULL;

		for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
			if (!strcmp(calls[i].name, tok))
				c = &calls[i];
		if (!c || rules == MAX_RULES) {
			fprintf(stderr, "failsys: unknown system call %s\n", tok);
			return 2;
		}
		rules++;
		f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
		                                      offsetof(struct seccomp_data, nr));
		if (c->family < 0) {
			f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)c->nr, 0, 1);
			f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
			                                      SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA));
			continue;
		}
		/* socket(family, ...): the family is the first argument */
		f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)c->nr, 0, 4);
		f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
		                                      offsetof(struct seccomp_data, args[0]));
		f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)c->family, 1, 0);
		f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
		                                      c->family == AF_INET ? AF_INET6 : 0xffff, 0, 1);
		f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
		                                      SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA));
	}
	f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	struct sock_fprog prog = { .len = (unsigned short)n, .filter = f };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
		perror("failsys: seccomp");
		return 2;
	}
	execvp(argv[4], argv + 4);
	perror("failsys: exec");
	return 127;
}
