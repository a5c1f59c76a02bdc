/*
 * poll.c - poll(), ppoll(), select() and pselect().  A connection still
 * deciding is decided first; pollwait.c looks at the rings.
 */
#include "shim.h"

#include "pollwait.h"

#include <time.h>

/* ---- poll and select (pollwait.c) --------------------------------------- */

/*
 * A connection still deciding would be polled as the TCP socket it is now;
 * a listener polled would not show connections without TCP.
 */
static void decide_polled_fd(int fd)
{
	uint16_t f = fd_flags(fd);

	if (fd_has_conn(fd))
		shim_follow_moved(fd);  /* a poll for POLLOUT only sees TCP's state too */
	if ((f & (FDF_PENDING | FDF_PREFIX)) == FDF_PENDING)
		hs_resolve_fd(fd);      /* one whose first bytes wait is the TCP socket still */
	if ((f & (FDF_LISTENING | FDF_NO_DIRECT)) == FDF_LISTENING)
		hs_listener_no_direct(fd);
}

static void decide_polled(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (fds[i].fd >= 0)
			decide_polled_fd(fds[i].fd);
}

static void decide_selected(int nfds, const fd_set *rd, const fd_set *wr, const fd_set *ex)
{
	for (int fd = 0; fd < nfds && fd < FD_SETSIZE; fd++)
		if (((fd_flags(fd) & (FDF_PENDING | FDF_LISTENING)) || fd_has_conn(fd)) &&
		    ((rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex))))
			decide_polled_fd(fd);
}

/*
 * The kernel answered a poll that smclo did not make its own (no read
 * events of a connection asked): a hang-up it reports for a connection
 * may be the doorbell socket's at a move (core/move.c) that came while it
 * slept.  Followed, and asked again of the TCP socket now there.
 */
static int poll_recheck_moved(struct pollfd *fds, nfds_t n, int r)
{
	for (nfds_t i = 0; r > 0 && i < n; i++) {
		struct pollfd *f = &fds[i];
		short was = f->revents;

		if (!(was & (POLLHUP | POLLERR)) || !fd_has_conn(f->fd))
			continue;
		shim_follow_moved(f->fd);
		f->revents = 0;
		if (sys_poll(f, 1, 0) < 0)
			f->revents = was;
		r -= !f->revents;
	}
	return r;
}

static int prefix_polled(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (fds[i].fd >= 0 && (fd_flags(fds[i].fd) & FDF_PREFIX))
			return 1;
	return 0;
}

/*
 * A connection whose first bytes wait to go over TCP (hs_send_prefix) is
 * polled as its TCP socket; but asleep there a poll would miss the switch
 * another thread's first write makes.  So such a poll sleeps in slices and,
 * once the first bytes went, decides and polls what the descriptor is now.
 */
static int poll_sliced(struct pollfd *fds, nfds_t n, int timeout, const sigset_t *mask)
{
	REAL(ppoll);
	long long waited = 0;

	for (;;) {
		int slice = timeout >= 0 && timeout - waited < 10 ? (int)(timeout - waited) : 10;
		struct timespec ts = { .tv_nsec = slice * 1000000L };
		int r = real_ppoll(fds, n, &ts, mask);

		waited += slice;
		/* the first bytes went meanwhile: what the TCP socket said is stale */
		if (!prefix_polled(fds, n)) {
			decide_polled(fds, n);
			return poll(fds, n, timeout < 0 ? -1 : timeout > waited ?
			                                   (int)(timeout - waited) : 0);
		}
		if (r != 0 || (timeout >= 0 && waited >= timeout))
			return r;
	}
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	REAL(poll);

	if (smclo_active && hs_sandboxed()) {
		/* the program's own call, and what only the rings know (moved.c) */
		int r = real_poll(fds, n, pollwait_moved_rings(fds, n, -1) ? 0 : timeout);
		return r < 0 ? r : pollwait_moved_rings(fds, n, r);
	}
	if (smclo_active)
		decide_polled(fds, n);
	if (smclo_active && timeout != 0 && prefix_polled(fds, n))
		return poll_sliced(fds, n, timeout, NULL);
	if (smclo_active && pollwait_needed(fds, n))
		return pollwait(fds, n, timeout, NULL);
	if (!smclo_active || !conn_count())
		return real_poll(fds, n, timeout);
	return poll_recheck_moved(fds, n, real_poll(fds, n, timeout));
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	(void)fdslen;
	return poll(fds, n, timeout);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	REAL(ppoll);

	if (smclo_active && hs_sandboxed()) {
		static const struct timespec now;
		int r = real_ppoll(fds, n, pollwait_moved_rings(fds, n, -1) ? &now : ts, mask);
		return r < 0 ? r : pollwait_moved_rings(fds, n, r);
	}
	if (smclo_active)
		decide_polled(fds, n);
	if (smclo_active && shim_timespec_ms(ts) != 0 && prefix_polled(fds, n))
		return poll_sliced(fds, n, shim_timespec_ms(ts), mask);
	if (smclo_active && pollwait_needed(fds, n))
		return pollwait(fds, n, shim_timespec_ms(ts), mask);
	if (!smclo_active || !conn_count())
		return real_ppoll(fds, n, ts, mask);
	return poll_recheck_moved(fds, n, real_ppoll(fds, n, ts, mask));
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
                       const sigset_t *mask, size_t fdslen)
{
	(void)fdslen;
	return ppoll(fds, n, ts, mask);
}

EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	REAL(select);

	if (smclo_active && hs_sandboxed()) {
		/* the program's own call, and what only the rings know (moved.c) */
		fd_set asked;
		struct timeval now = { 0, 0 };
		int r;

		if (rd)
			asked = *rd;
		r = real_select(nfds, rd, wr, ex,
		                pollwait_moved_select(nfds, rd ? &asked : NULL, NULL, -1) ? &now : tv);
		return r < 0 ? r : pollwait_moved_select(nfds, rd ? &asked : NULL, rd, r);
	}
	if (smclo_active)
		decide_selected(nfds, rd, wr, ex);
	if (smclo_active && pollwait_select_needed(nfds, rd)) {
		long long ms = tv ? tv->tv_sec * 1000LL + (tv->tv_usec + 999) / 1000 : -1;
		return pollwait_select(nfds, rd, wr, ex, ms > INT_MAX ? INT_MAX : (int)ms, NULL);
	}
	return real_select(nfds, rd, wr, ex, tv);
}

EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *ts,
                   const sigset_t *mask)
{
	REAL(pselect);

	if (smclo_active && hs_sandboxed()) {
		fd_set asked;
		static const struct timespec now;
		int r;

		if (rd)
			asked = *rd;
		r = real_pselect(nfds, rd, wr, ex,
		                 pollwait_moved_select(nfds, rd ? &asked : NULL, NULL, -1) ? &now : ts,
		                 mask);
		return r < 0 ? r : pollwait_moved_select(nfds, rd ? &asked : NULL, rd, r);
	}
	if (smclo_active)
		decide_selected(nfds, rd, wr, ex);
	if (smclo_active && pollwait_select_needed(nfds, rd))
		return pollwait_select(nfds, rd, wr, ex, shim_timespec_ms(ts), mask);
	return real_pselect(nfds, rd, wr, ex, ts, mask);
}
