/*
 * exec.c - every exec entry of libc goes through the handover (handover.h).
 *
 * glibc's execl, execle, execlp, execv, execvp and fexecve reach the kernel
 * through an internal execve that no preload library sees, so each is
 * interposed here, and all of them end in exec_with_handover().  The
 * entries that start a program in a child (posix_spawn, system, popen) are
 * in spawn.c; they end here too, in the child.
 */
#include "exec.h"

#include "conn.h"
#include "fdtab.h"
#include "handover.h"
#include "handshake.h"
#include "interpose.h"
#include "sys.h"
#include "epoll_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static int call_real(const struct exec_call *x, char *const envp[])
{
	switch (x->kind) {
	case EXEC_PATH: {
		REAL(execve);
		return real_execve(x->path, x->argv, envp);
	}
	case EXEC_SEARCH: {
		REAL(execvpe);
		return real_execvpe(x->path, x->argv, envp);
	}
	case EXEC_FD: {
		REAL(fexecve);
		return real_fexecve(x->fd, x->argv, envp);
	}
	default: {
		REAL(execveat);
		return real_execveat(x->fd, x->path, x->argv, envp, x->flags);
	}
	}
}

static void put_fd_path(char *out, size_t len, int fd, const char *rest)
{
	char num[16];
	int n = 0;
	unsigned v = (unsigned)fd;

	do {
		num[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	size_t o = 0;
	for (const char *p = "/proc/self/fd/"; *p && o + 1 < len; p++)
		out[o++] = *p;
	while (n && o + 1 < len)
		out[o++] = num[--n];
	if (rest && *rest) {
		if (o + 1 < len)
			out[o++] = '/';
		for (const char *p = rest; *p && o + 1 < len; p++)
			out[o++] = *p;
	}
	out[o] = '\0';
}

/*
 * The file the kernel will execute, as far as we can tell without
 * allocating (a vfork child may be calling): a PATH search for the
 * searching variants, as execvp does it.  NULL if there is none.
 */
static const char *target_of(const struct exec_call *x, char *buf, size_t len)
{
	const char *path, *p;

	switch (x->kind) {
	case EXEC_PATH:
		return x->path;
	case EXEC_FD:
		put_fd_path(buf, len, x->fd, NULL);
		return buf;
	case EXEC_AT:
		if (x->path[0] == '/')
			return x->path;
		put_fd_path(buf, len, x->fd, (x->flags & AT_EMPTY_PATH) && !*x->path ? NULL : x->path);
		return x->fd == AT_FDCWD ? x->path : buf;
	default:
		break;
	}
	if (strchr(x->path, '/'))
		return x->path;
	path = getenv("PATH");
	for (p = path && *path ? path : "/bin:/usr/bin"; *p;) {
		const char *end = strchr(p, ':');
		size_t dl = end ? (size_t)(end - p) : strlen(p), fl = strlen(x->path);

		if (dl + fl + 2 <= len) {
			memcpy(buf, dl ? p : ".", dl ? dl : 1);
			if (!dl)
				dl = 1;
			buf[dl] = '/';
			memcpy(buf + dl + 1, x->path, fl + 1);
			if (access(buf, X_OK) == 0)
				return buf;
		}
		if (!end)
			break;
		p = end + 1;
	}
	return NULL;
}

int exec_with_handover(const struct exec_call *x, char *const envp[])
{
	size_t n = 0;
	int rc, e;

	while (envp && envp[n])
		n++;
	if (!smclo_active)
		return call_real(x, envp);
	if (!sys_in_vfork_child())
		hs_listeners_before_exec();     /* a vfork child would change its parent's */
	{
		char *env_out[n + 2];
		char record[HANDOVER_ENV_MAX], target[PATH_MAX];
		struct handover_undo undo;
		const char *file = target_of(x, target, sizeof(target));
		char *const *env;

		int loads = handover_target_loads_smclo(file, envp);

		if (loads < 0)
			return call_real(x, envp);      /* refused: nothing to hand over */
		epoll_watch_before_exec();
		env = handover_exec(envp, loads, env_out, n + 2, record, sizeof(record), &undo);
		rc = call_real(x, env);
		e = errno;
		handover_undo(&undo);
	}
	errno = e;
	return rc;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	struct exec_call x = { .kind = EXEC_PATH, .path = path, .argv = argv };

	return exec_with_handover(&x, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	struct exec_call x = { .kind = EXEC_SEARCH, .path = file, .argv = argv };

	return exec_with_handover(&x, envp);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	struct exec_call x = { .kind = EXEC_FD, .fd = fd, .argv = argv };

	return exec_with_handover(&x, envp);
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
                    int flags)
{
	struct exec_call x = { .kind = EXEC_AT, .fd = dirfd, .path = path, .argv = argv,
	                       .flags = flags };

	return exec_with_handover(&x, envp);
}

/* The variadic forms: count the arguments, then the vector forms. */
#define COLLECT_ARGS(arg, argv, ap, after)                                  \
	size_t argc_ = 1;                                                   \
	va_start(ap, arg);                                                  \
	while (va_arg(ap, char *))                                          \
		argc_++;                                                    \
	va_end(ap);                                                         \
	char *argv[argc_ + 1];                                              \
	va_start(ap, arg);                                                  \
	argv[0] = (char *)arg;                                              \
	for (size_t i_ = 1; i_ <= argc_; i_++)                              \
		argv[i_] = va_arg(ap, char *);                              \
	after;                                                              \
	va_end(ap)

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	COLLECT_ARGS(arg, argv, ap, (void)0);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	COLLECT_ARGS(arg, argv, ap, (void)0);
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	char **envp;
	COLLECT_ARGS(arg, argv, ap, envp = va_arg(ap, char **));
	return execve(path, argv, envp);
}
