/*
 * exec_server - an inetd-style server: for each connection it forks, puts
 * the connection on the child's stdin and stdout and starts /bin/cat
 * through one libc entry, the one named on the command line:
 *
 *   exec_server PORT HOW [PROGRAM]
 *   HOW: execl execle execlp execv execvp execve fexecve execveat
 *        posix_spawn posix_spawnp posix_spawn_closefrom (closing every
 *        descriptor above 2 in the file actions) system popen vfork
 *        execle-bare (an environment without LD_PRELOAD, with SMCLO_DIR:
 *        only a program linked with -lsmclo loads smclo)
 *
 * glibc reaches the kernel from most of these through an internal execve
 * that a preload library cannot see, so each is its own case in
 * tests/py/test_exec.py.  PROGRAM (default /bin/cat) is what runs.
 *
 * With EXEC_SERVER_WAIT_DATA set in its environment it starts PROGRAM only
 * once the client's first bytes are there to read: a program that cannot
 * load smclo then finds them in the ring, out of its reach (a reset),
 * rather than on TCP after the connection went on there (handed-on).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const char *prog = "/bin/cat";

static void die(const char *what)
{
	perror(what);
	_exit(126);
}

/* In a child whose stdin and stdout are the connection. */
static void run_cat(const char *how)
{
	char *argv[] = { "cat", NULL };

	if (!strcmp(how, "execl"))
		execl(prog, "cat", (char *)NULL);
	else if (!strcmp(how, "execle"))
		execle(prog, "cat", (char *)NULL, environ);
	else if (!strcmp(how, "execle-bare")) {
		/* no LD_PRELOAD: only a program linked with -lsmclo loads it */
		char dir[4200];
		char *bare[] = { "PATH=/bin:/usr/bin", dir, NULL };

		snprintf(dir, sizeof(dir), "SMCLO_DIR=%s", getenv("SMCLO_DIR") ? getenv("SMCLO_DIR") : "");
		execle(prog, "cat", (char *)NULL, bare);
	}
	else if (!strcmp(how, "execlp"))
		execlp(strrchr(prog, '/') + 1, "cat", (char *)NULL);
	else if (!strcmp(how, "execv"))
		execv(prog, argv);
	else if (!strcmp(how, "execvp"))
		execvp(strrchr(prog, '/') + 1, argv);
	else if (!strcmp(how, "execve"))
		execve(prog, argv, environ);
	else if (!strcmp(how, "fexecve")) {
		int fd = open(prog, O_RDONLY | O_CLOEXEC);
		fexecve(fd, argv, environ);
	} else if (!strcmp(how, "execveat"))
		execveat(AT_FDCWD, prog, argv, environ, 0);
	else if (!strcmp(how, "system"))
		_exit(WEXITSTATUS(system(prog)));
	die(how);
}

/* The parent's part for the ways that start the program from here. */
static void spawn_cat(const char *how, int c)
{
	char *argv[] = { "cat", NULL };
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int rc;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, c, 0);
	posix_spawn_file_actions_adddup2(&fa, c, 1);
	/* what inetd-style servers add: every descriptor above 2 closed */
	if (!strcmp(how, "posix_spawn_closefrom"))
		posix_spawn_file_actions_addclosefrom_np(&fa, 3);
	if (strcmp(how, "posix_spawnp"))
		rc = posix_spawn(&pid, prog, &fa, NULL, argv, environ);
	else
		rc = posix_spawnp(&pid, strrchr(prog, '/') + 1, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc) {
		errno = rc;
		die(how);
	}
}

/* popen: the command reads the connection (stdin); we copy its output back. */
static void popen_cat(int c)
{
	char buf[65536];
	size_t n;
	FILE *f;

	dup2(c, 0);
	if (!(f = popen(prog, "r")))
		die("popen");
	close(0);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		if (write(c, buf, n) != (ssize_t)n)
			die("write");
	pclose(f);
	_exit(0);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	const char *how;
	int l, one = 1;

	if (argc < 3) {
		fprintf(stderr, "usage: exec_server PORT HOW [PROGRAM]\n");
		return 2;
	}
	how = argv[2];
	if (argc > 3)
		prog = argv[3];
	a.sin_port = htons((uint16_t)atoi(argv[1]));
	signal(SIGCHLD, SIG_IGN);
	l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 64) < 0)
		die("listen");
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int c = accept(l, NULL, NULL);
		pid_t pid;

		if (c < 0)
			continue;
		if (getenv("EXEC_SERVER_WAIT_DATA")) {
			struct pollfd p = { .fd = c, .events = POLLIN };
			poll(&p, 1, 10000);
		}
		if (!strncmp(how, "posix_spawn", 11)) {
			spawn_cat(how, c);
			close(c);
			continue;
		}
		pid = strcmp(how, "vfork") ? fork() : vfork();
		if (pid == 0) {
			if (!strcmp(how, "vfork")) {
				dup2(c, 0);
				dup2(c, 1);
				execl(prog, "cat", (char *)NULL);
				_exit(127);
			}
			close(l);
			if (!strcmp(how, "popen"))
				popen_cat(c);
			dup2(c, 0);
			dup2(c, 1);
			close(c);
			run_cat(how);
		}
		close(c);
	}
}
