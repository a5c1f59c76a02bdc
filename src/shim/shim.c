/*
 * shim.c - the lookup behind shim_conn() (shim.h): the connection a
 * descriptor names, decided first if its handshake is still under way
 * (unless it waits for its first bytes to go over TCP: hs_send_prefix).
 */
#include "shim.h"

#include <time.h>

/*
 * A blocking read on a connection whose first bytes are still to go over
 * TCP (hs_send_prefix): nothing can come before they went, and a read asleep
 * in the TCP socket would stay there after the switch; so it waits here for
 * another thread's first write (a reader started before its writer), at
 * most its SO_RCVTIMEO.  1 once they went, 0 to read the TCP socket as is.
 */
static int shim_wait_prefix(int fd, size_t n, int flags)
{
	struct conn *c;
	int timeout_ms, slept_us = 0, step = 50;

	if (!n || (flags & (MSG_DONTWAIT | MSG_PEEK)) || !(c = fd_get_conn(fd)))
		return 0;
	/* the descriptor's own flag: the program may have changed it since connect() */
	timeout_ms = (sys_fcntl(fd, F_GETFL, 0) & O_NONBLOCK) ? -1 : io_rcvtimeo_ms(c, fd);
	conn_put(c);
	if (timeout_ms < 0)
		return 0;       /* non-blocking: the TCP socket says EAGAIN, as it should */
	while ((fd_flags(fd) & FDF_PREFIX) && (!timeout_ms || slept_us < timeout_ms * 1000)) {
		nanosleep(&(struct timespec){ .tv_nsec = step * 1000L }, NULL);
		slept_us += step;
		step = step < 2000 ? step * 2 : 2000;
	}
	return !(fd_flags(fd) & FDF_PREFIX);
}

struct conn *shim_conn_lookup(int fd, size_t n, int flags)
{
	struct conn *c;

	/* its first bytes not sent yet: nothing woke the server, so nothing can
	 * be decided; the descriptor is the TCP socket it looks like */
	if ((fd_flags(fd) & FDF_PREFIX) && !shim_wait_prefix(fd, n, flags))
		return NULL;
	c = fd_get_conn(fd);

	if (c && atomic_load_explicit(&c->pending, memory_order_relaxed) != PENDING_NONE) {
		int blocking = !(flags & (MSG_DONTWAIT | MSG_PEEK)) && !atomic_load(&c->sh->nonblock);
		/* every call but a small write needs the decision */
		hs_resolve(fd, c, blocking ? n : 0);
	}
	if (c && c->mode != MODE_SHM) {
		conn_put(c);
		return NULL;
	}
	return c;
}
