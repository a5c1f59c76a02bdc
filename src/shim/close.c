/*
 * close.c - close(), close_range() and closefrom(): what smclo forgets of a
 * descriptor that goes, and smclo's own descriptors kept out of a program's
 * "close everything" loop.
 */
#include "shim.h"

#include "epoll_early.h"
#include "epoll_watch.h"

#include <linux/close_range.h>
#include <sys/syscall.h>

/* ---- closing ------------------------------------------------------------ */

/* Every close of anything passes here: a plain descriptor costs one load. */
void shim_forget_fd(int fd)
{
	uint16_t f;

	if (!smclo_active)
		return;
	f = fd_flags(fd);
	/*
	 * A vfork child must not end its parent's connection, listener, epoll
	 * set or handshake.  Asked only then (a system call): a plain socket's
	 * flags cleared by such a child only make the parent ask the kernel
	 * again (FDF_KNOWN gone), so every other close goes without it.
	 */
	if ((fd_has_conn(fd) || (f & (FDF_LISTENING | FDF_EPOLL | FDF_WATCHED | FDF_PENDING))) &&
	    !hs_sandboxed() && sys_in_vfork_child())
		return;
	if (f & (FDF_WATCHED | FDF_EPOLL))
		epoll_watch_fd_closed(fd);
	if ((f & FDF_EPOLL) || fd_epoll_early_count(fd) || epoll_early_names_set(fd))
		epoll_early_fd_closed(fd);
	if (f & FDF_PENDING)
		hs_resolve_fd(fd);      /* bytes written while undecided must arrive */
	if (fd_has_conn(fd))
		hs_release_fd(fd);
	if (f & FDF_LISTENING)
		hs_listener_closed(fd);
	if (f) {
		fd_set_flags(fd, 0);
		fd_epoll_early(fd, 0);
	}
}

/*
 * Daemons close every descriptor they did not open themselves (a close()
 * loop, close_range, closefrom), and so do inetd-style children before they
 * exec a handler: smclo's own descriptors among them (the registry, each
 * connection's state, region and TCP socket) are kept (fd_is_ours).  The
 * program sees them closed, and never gets their numbers back from the
 * kernel anyway (they sit above the program's range).
 */
EXPORT int close(int fd)
{
	REAL(close);

	if (smclo_active && fd_is_ours(fd))
		return 0;
	shim_forget_fd(fd);
	return real_close(fd);
}

/* The first of smclo's own descriptors in [@from, @last], or -1. */
static int next_ours(unsigned from, unsigned last)
{
	int o = fd_next_ours(from, last);

	while (o >= 0 && !fd_is_ours(o))
		o = (unsigned)o < last ? fd_next_ours((unsigned)o + 1, last) : -1;
	/* the registry's may lie above the table (fd_is_ours) */
	if (registry_fd >= 0 && (unsigned)registry_fd >= from && (unsigned)registry_fd <= last &&
	    (o < 0 || registry_fd < o))
		o = registry_fd;
	return o;
}

/*
 * close_range over [@first, @last], around smclo's own descriptors; the
 * connections and listeners among them are forgotten as close() would (a
 * number the kernel hands out again must not still name a connection).
 */
static int close_range_keeping_ours(unsigned first, unsigned last, int flags)
{
	unsigned from = first;
	int high, o;

	if (!smclo_active || (flags & CLOSE_RANGE_CLOEXEC) || first > last)
		return (int)syscall(SYS_close_range, first, last, flags);
	high = fd_table_high();
	for (unsigned fd = first; high >= 0 && fd <= last && fd <= (unsigned)high; fd++)
		if (fd_flags((int)fd) || fd_has_conn((int)fd))
			shim_forget_fd((int)fd);
	for (;; from = (unsigned)o + 1) {
		o = next_ours(from, last);
		if (o < 0)
			break;
		if ((unsigned)o > from && syscall(SYS_close_range, from, (unsigned)o - 1, flags) < 0)
			return -1;
	}
	if (from > last)        /* the last ones were all ours */
		return 0;
	return (int)syscall(SYS_close_range, from, last, flags);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	return close_range_keeping_ours(first, last, flags);
}

EXPORT void closefrom(int lowfd)
{
	if (lowfd < 0)
		lowfd = 0;
	if (close_range_keeping_ours((unsigned)lowfd, ~0U, 0) < 0) {
		/* no close_range (an old kernel): one by one, as glibc would */
		for (int fd = lowfd; fd < fdtab_size; fd++)
			close(fd);
	}
}
