/*
 * descriptors.c - dup(), dup2(), dup3() and fcntl(): a copy of a descriptor
 * names what the original names (its connection, its flags), and O_NONBLOCK
 * set on a connection is the connection's.
 */
#include "shim.h"

#include "epoll_watch.h"

#include <stdarg.h>

/* ---- descriptor copies -------------------------------------------------- */

/* @newfd now names what @oldfd names. */
static void copy_binding(int oldfd, int newfd)
{
	struct conn *c;

	if (newfd < 0 || oldfd == newfd || !smclo_active)
		return;
	if ((fd_flags(oldfd) || fd_has_conn(oldfd)) && sys_in_vfork_child())
		return;         /* the parent's table: not ours to change */
	/* a copy of a listener is one still (without an entry: the original
	 * holds it, and hands it on when it closes, hs_listener_closed) */
	fd_set_flags(newfd, fd_flags(oldfd) & ~(FDF_WATCHED | FDF_EPOLL | FDF_DIRECT));
	/* an option set through either descriptor is set for both: we no longer know */
	if (fd_flags(oldfd) & FDF_TCP) {
		fd_add_flags(oldfd, FDF_TIMEOUTS);
		fd_add_flags(newfd, FDF_TIMEOUTS);
	}
	epoll_watch_epfd_copied(oldfd);
	c = fd_get_conn(oldfd);
	if (c) {
		fd_bind_conn(c, newfd);
		conn_put(c);
	}
}

EXPORT int dup(int fd)
{
	REAL(dup);
	int n;

	if (smclo_active)
		hs_resolve_fd(fd);      /* the copy must name what the decision makes of it */
	n = real_dup(fd);

	copy_binding(fd, n);
	return n;
}

EXPORT int dup2(int fd, int fd2)
{
	REAL(dup2);
	int n;

	if (smclo_active)
		hs_resolve_fd(fd);
	if (fd != fd2 && fcntl(fd, F_GETFD) >= 0)
		shim_forget_fd(fd2);         /* dup2 closes what fd2 was */
	n = real_dup2(fd, fd2);
	copy_binding(fd, n);
	return n;
}

EXPORT int dup3(int fd, int fd2, int flags)
{
	REAL(dup3);
	int n;

	if (smclo_active)
		hs_resolve_fd(fd);
	if (fd != fd2 && fcntl(fd, F_GETFD) >= 0)
		shim_forget_fd(fd2);
	n = real_dup3(fd, fd2, flags);
	copy_binding(fd, n);
	return n;
}

static int fcntl_common(int fd, int cmd, void *arg,
                        int (*real)(int, int, ...))
{
	int rc;

	if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && smclo_active)
		hs_resolve_fd(fd);
	rc = real(fd, cmd, arg);

	if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && rc >= 0)
		copy_binding(fd, rc);
	if (cmd == F_SETFL && rc == 0 && ((long)arg & O_NONBLOCK))
		hs_listener_no_direct(fd);
	if (cmd == F_SETFL && rc == 0 && fd_has_conn(fd)) {
		struct conn *c = shim_conn(fd);
		if (c) {
			atomic_store(&c->sh->nonblock, ((long)arg & O_NONBLOCK) != 0);
			if ((long)arg & O_ASYNC)
				io_bell_each(c);
			conn_put(c);
		}
	}
	if ((cmd == F_SETOWN || cmd == F_SETOWN_EX) && rc == 0 && fd_has_conn(fd)) {
		struct conn *c = shim_conn(fd);
		/* urgent data comes on the TCP socket after a move (core/move.c),
		 * before this process follows: its SIGURG goes to the same owner */
		if (c) {
			if (c->tcp_fd >= 0)
				real(c->tcp_fd, cmd, arg);
			conn_put(c);
		}
	}
	return rc;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	REAL(fcntl);
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(fd, cmd, arg, real_fcntl);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	static int (*cache)(int, int, ...);
	int (*real_fcntl64)(int, int, ...) = __atomic_load_n(&cache, __ATOMIC_RELAXED);
	va_list ap;
	void *arg;

	if (!real_fcntl64) {
		real_fcntl64 = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl64");
		__atomic_store_n(&cache, real_fcntl64, __ATOMIC_RELAXED);
	}
	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(fd, cmd, arg, real_fcntl64);
}
