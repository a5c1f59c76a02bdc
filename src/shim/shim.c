/*
 * shim.c - the lookup behind shim_conn() (shim.h): the connection a
 * descriptor names, decided first if its handshake is still under way
 * (unless it waits for its first bytes to go over TCP: hs_send_prefix).
 */
#include "shim.h"

#include <poll.h>

/* Is @fd a connection whose first write (hs_send_prefix) has not gone yet? */
static int prefix_waits(int fd)
{
	struct conn *c = fd_get_conn(fd);
	int waits = c && atomic_load(&c->tcp_prefix) == CONN_PREFIX_WAIT;

	if (c)
		conn_put(c);
	return waits;
}

/*
 * A blocking read on a connection whose first bytes are still to go over
 * TCP (hs_send_prefix): nothing the server sends can come before they
 * went, and a read asleep in the TCP socket would stay there after the
 * switch; so it waits here, in slices, for another thread's first write (a
 * reader started before its writer), watching the TCP socket meanwhile:
 * what comes there (a server that speaks first once the kernel's deferral
 * ran out, an end of stream) takes the connection to TCP, and so do a
 * signal and SO_RCVTIMEO running out (the read then waits in the kernel,
 * as on TCP).  1 once the first bytes went, 0 to read the TCP socket.
 */
static int shim_wait_prefix(int fd, size_t n, int flags)
{
	struct conn *c;
	long long waited = 0;
	int timeout_ms;

	if (!n || (flags & MSG_DONTWAIT) || !(c = fd_get_conn(fd)))
		return 0;
	/* the descriptor's own flag: the program may have changed it since connect() */
	timeout_ms = (sys_fcntl(fd, F_GETFL, 0) & O_NONBLOCK) ? -1 : io_rcvtimeo_ms(c, fd);
	conn_put(c);
	if (timeout_ms < 0)
		return 0;       /* non-blocking: the TCP socket says EAGAIN, as it should */
	while (prefix_waits(fd)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = sys_poll(&p, 1, 10);

		waited += 10;
		if (!prefix_waits(fd))
			break;          /* meanwhile went (what woke us is the switch's) */
		if (r != 0 || (timeout_ms && waited >= timeout_ms)) {
			hs_resolve_fd(fd);      /* TCP, at once: nothing woke the server */
			return 0;
		}
	}
	return 1;
}

struct conn *shim_conn_lookup(int fd, size_t n, int flags, int reading)
{
	struct conn *c;

	/* its first bytes not sent yet: nothing woke the server, so nothing can
	 * be decided; the descriptor is the TCP socket it looks like */
	if ((fd_flags(fd) & FDF_PREFIX) && prefix_waits(fd) && !shim_wait_prefix(fd, n, flags))
		return NULL;
	c = fd_get_conn(fd);

	if (c && atomic_load_explicit(&c->pending, memory_order_relaxed) != PENDING_NONE) {
		int blocking = !(flags & (MSG_DONTWAIT | MSG_PEEK)) && !atomic_load(&c->sh->nonblock);
		/* every call but a small write needs the decision */
		hs_resolve(fd, c, blocking ? n : 0);
	}
	/* moved to TCP (core/move.c): the descriptor is the TCP socket now,
	 * and only a read still has the ring's last bytes to take first */
	if (c && c->mode == MODE_SHM && move_seen(c))
		hs_moved_follow(c);     /* MODE_TCP once the ring is empty */
	if (c && (c->mode != MODE_SHM || (!reading && atomic_load(&c->moved_here)))) {
		conn_put(c);
		return NULL;
	}
	return c;
}

void shim_follow_moved(int fd)
{
	struct conn *c = fd_get_conn(fd);

	if (!c)
		return;
	if (c->mode == MODE_SHM && !atomic_load(&c->moved_here) && move_seen(c))
		hs_moved_follow(c);
	conn_put(c);
}
