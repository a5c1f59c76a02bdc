/*
 * epoll.c - the epoll calls.  Readiness is the kernel's (an accelerated
 * descriptor is a real socket); what epoll_watch.c adds is the rings' view of
 * bytes that came without a doorbell, and a look at them before sleeping.
 */
#include "shim.h"

#include "epoll_early.h"
#include "epoll_watch.h"

#include <sys/epoll.h>
#include <time.h>

/* ---- epoll (epoll_watch.c) ---------------------------------------------------- */

/* A new set at @fd: what had the number before was closed unseen, if at all. */
static void epoll_created(int fd)
{
	if (!smclo_active)
		return;
	epoll_watch_epoll_created(fd);
	epoll_early_epoll_created(fd);
}

EXPORT int epoll_create(int size)
{
	REAL(epoll_create);
	int fd = real_epoll_create(size);

	epoll_created(fd);
	return fd;
}

EXPORT int epoll_create1(int flags)
{
	REAL(epoll_create1);
	int fd = real_epoll_create1(flags);

	epoll_created(fd);
	return fd;
}

/*
 * nginx puts its upstream socket into epoll before connect(): such
 * registrations are recorded, to be moved across the switch (epoll_early.c).
 * A registration made after connect() is made on what the switch leaves
 * there (hs_resolve_fd, above the real call).
 */
static int registered_early(int fd)
{
	uint16_t f = fd_flags(fd);

	return ((f & (FDF_TCP | FDF_LISTENING | FDF_PENDING)) == FDF_TCP && !fd_has_conn(fd)) ||
	       (f & FDF_PREFIX);       /* pending, its first bytes to go over TCP */
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	REAL(epoll_ctl);
	int rc;

	if (smclo_active && op != EPOLL_CTL_DEL && !(fd_flags(fd) & FDF_PREFIX)) {
		hs_resolve_fd(fd);      /* the kernel must watch the descriptor it will be */
		hs_listener_no_direct(fd);      /* it would not see direct connections */
	}
	/* undecided, first bytes to go: the TCP socket's registration, recorded
	 * to follow the switch, never watched or parked (epoll_watch.c) */
	if (smclo_active && (fd_flags(fd) & FDF_PREFIX)) {
		rc = real_epoll_ctl(epfd, op, fd, ev);
		if (rc == 0)
			epoll_early_ctl(epfd, op, fd, ev);
		return rc;
	}
	if (smclo_active && (rc = epoll_watch_ctl_parked(epfd, op, fd, ev)) != WATCH_PASS)
		return rc;
	rc = real_epoll_ctl(epfd, op, fd, ev);

	if (rc == 0 && smclo_active) {
		epoll_watch_ctl(epfd, op, fd, ev);
		if (registered_early(fd))
			epoll_early_ctl(epfd, op, fd, ev);
	}
	return rc;
}

/*
 * The three epoll waits share one shape: epoll_watch.c answers (>= 0), or says the
 * set is not ours, or to sleep in the kernel and show it what woke us: when
 * that was only stale doorbells, the wait goes on for what is left of the
 * timeout.
 */
struct epoll_call {
	int (*wait)(int, struct epoll_event *, int, int);
	int (*pwait)(int, struct epoll_event *, int, int, const sigset_t *);
	int (*pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
	const sigset_t *mask;
	const struct timespec *ts;      /* pwait2's own timeout, for the first sleep */
};

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static int real_epoll(const struct epoll_call *k, int epfd, struct epoll_event *ev, int max,
                      int timeout, int first)
{
	struct timespec ts = { .tv_sec = timeout / 1000, .tv_nsec = (timeout % 1000) * 1000000L };

	if (k->wait)
		return k->wait(epfd, ev, max, timeout);
	if (k->pwait)
		return k->pwait(epfd, ev, max, timeout, k->mask);
	return k->pwait2(epfd, ev, max, first || timeout < 0 ? k->ts : &ts, k->mask);
}

static int watched_epoll(const struct epoll_call *k, int epfd, struct epoll_event *ev, int max,
                         int timeout)
{
	long long deadline = timeout > 0 ? now_ms() + timeout : 0;

	if (smclo_active)
		epoll_early_before_wait(epfd);
	for (int first = 1;; first = 0) {
		int v = smclo_active ? epoll_watch_before_wait(epfd, ev, max, timeout, k->mask == NULL)
		                     : WATCH_PASS;
		int r, e;

		if (v >= 0) {
			r = v;  /* what the watch found, kernel events among it */
		} else {
			r = real_epoll(k, epfd, ev, max, timeout, first);
			e = errno;
			r = v == WATCH_PASS ? epoll_watch_drop_parked(ev, r) :
			                      epoll_watch_after_sleep(epfd, ev, r);
			errno = e;
		}
		/* a watched doorbell's event as the program's (epoll_early.c) */
		e = errno;
		r = epoll_early_after_wait(ev, r);
		errno = e;
		if (r != 0 || timeout == 0)
			return r;
		if (timeout > 0 && (timeout = (int)(deadline - now_ms())) <= 0)
			return 0;
	}
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	REAL(epoll_wait);
	struct epoll_call k = { .wait = real_epoll_wait };

	return watched_epoll(&k, epfd, ev, max, timeout);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
                       const sigset_t *mask)
{
	REAL(epoll_pwait);
	struct epoll_call k = { .pwait = real_epoll_pwait, .mask = mask };

	return watched_epoll(&k, epfd, ev, max, timeout);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *ts,
                        const sigset_t *mask)
{
	REAL(epoll_pwait2);
	struct epoll_call k = { .pwait2 = real_epoll_pwait2, .mask = mask, .ts = ts };
	return watched_epoll(&k, epfd, ev, max, shim_timespec_ms(ts));
}
