/*
 * pollwait.c - poll() and select() on accelerated connections.
 *
 * The kernel answers for every descriptor; what it cannot know about is bytes
 * that reached a ring without a doorbell.  That happens while an epoll set of
 * this process watches the ring (epoll_watch.c), and such bytes stay unread when a
 * program reads part of them and then turns to poll().  So a poll first looks
 * at the rings of the accelerated descriptors it asks to read; before it
 * sleeps it counts itself among each ring's sleepers (writers always ring for
 * a sleeper) and looks once more.  Like a blocking read it watches the rings,
 * and now and then the kernel, for a moment before sleeping (spin.c's rules),
 * and it drops stale doorbells from what the kernel reports, so "readable"
 * means there is something to read.  select() is poll() underneath, the way
 * the kernel implements it too.
 */
#include "pollwait.h"
#include "fdtab.h"
#include "handshake.h"

#include "conn.h"
#include "io.h"
#include "spin.h"
#include "sys.h"
#include "epoll_watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define KERNEL_LOOK_NS 4000
#define READ_EVENTS (POLLIN | POLLRDNORM)
#define ENDED       (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)

struct polled {
	struct conn *c;         /* referenced; NULL for an epoll set */
	nfds_t i;               /* its index in the pollfd array */
};

static int wants_us(const struct pollfd *p)
{
	return p->fd >= 0 && (p->events & READ_EVENTS) &&
	       (fd_has_conn(p->fd) || (fd_flags(p->fd) & FDF_EPOLL));
}

int pollwait_needed(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (wants_us(&fds[i]))
			return 1;
	return 0;
}

/* The accelerated connections and epoll sets among @fds; returns how many. */
static int gather(const struct pollfd *fds, nfds_t n, struct polled *p)
{
	int k = 0;

	for (nfds_t i = 0; i < n; i++) {
		struct conn *c = NULL;

		if (!wants_us(&fds[i]))
			continue;
		if (!(fd_flags(fds[i].fd) & FDF_EPOLL)) {
			if (!(c = fd_get_conn(fds[i].fd)))
				continue;
			if (c->mode == MODE_SHM && move_seen(c))
				hs_moved_follow(c);     /* the TCP socket, and the ring's last bytes */
			if (c->mode != MODE_SHM) {
				conn_put(c);
				continue;
			}
		}
		p[k].c = c;
		p[k++].i = i;
	}
	return k;
}

static int rings_unread(const struct polled *p, int k)
{
	for (int j = 0; j < k; j++)
		if (p[j].c && rx_ring_readable(p[j].c))
			return 1;
	return 0;
}

/* Where the peers of the watched rings run, as a spin weighs it (spin.h). */
static uint32_t peers_cpu(const struct polled *p, int k)
{
	uint32_t cpu = 0, mine;

	if (!spin_confined())
		return 0;
	mine = spin_cpu_tag();
	for (int j = 0; j < k && (!cpu || cpu == mine); j++)
		if (p[j].c)
			cpu = spin_peer_pick(cpu, io_peer_cpu(p[j].c), mine);
	return cpu;
}

static void count_sleepers(const struct polled *p, int k, int d)
{
	for (int j = 0; j < k; j++)
		if (p[j].c)
			atomic_fetch_add_explicit(&p[j].c->tx->sleepers, (uint32_t)d, memory_order_seq_cst);
}

/*
 * The kernel reported @r descriptors ready in @fds: take out stale doorbells
 * (an empty ring, a stream that goes on) and add what only the rings know.
 */
/*
 * A connection moved to TCP while we slept (core/move.c): what the kernel
 * said was its doorbell socket's hang-up.  Follow it, and ask again about
 * the TCP socket now at that number.
 */
static void correct_moved(struct pollfd *f, struct conn *c, int *r)
{
	short was = f->revents;

	hs_moved_follow(c);
	f->revents = 0;
	if (sys_poll(f, 1, 0) < 0)
		f->revents = 0;
	*r += (f->revents != 0) - (was != 0);
}

/* The end of the stream as TCP reports it, not as the doorbell socket does
 * (core/tcpend.c): a closed peer is no hang-up, a reset is an error. */
static void correct_end(struct pollfd *f, struct conn *c, int *r)
{
	short was = f->revents;

	f->revents = tcpend_poll_events(c, was, f->events);
	*r += (f->revents != 0) - (was != 0);
}

static int correct(struct pollfd *fds, const struct polled *p, int k, int r)
{
	for (int j = 0; j < k; j++) {
		struct pollfd *f = &fds[p[j].i];
		int unread;

		if (p[j].c && !atomic_load(&p[j].c->moved_here) && move_seen(p[j].c))
			correct_moved(f, p[j].c, &r);
		else if (p[j].c)
			correct_end(f, p[j].c, &r);
		unread = p[j].c ? rx_ring_readable(p[j].c) : epoll_watch_epfd_polled(f->fd);

		if (unread) {
			r += f->revents == 0;
			f->revents |= f->events & READ_EVENTS;
		} else if (p[j].c && (f->revents & READ_EVENTS) && !(f->revents & ENDED) &&
		           rx_settle_bells(p[j].c, f->fd)) {
			f->revents &= ~READ_EVENTS;
			r -= f->revents == 0;
		}
	}
	return r;
}

static int kernel_poll(struct pollfd *fds, nfds_t n, int timeout, const sigset_t *mask)
{
	struct timespec ts = { .tv_sec = timeout / 1000, .tv_nsec = (timeout % 1000) * 1000000L };

	return sys_ppoll(fds, n, timeout < 0 ? NULL : &ts, mask);
}

static int look_now(struct pollfd *fds, nfds_t n, const struct polled *p, int k,
                    const sigset_t *mask)
{
	int r = kernel_poll(fds, n, 0, mask);

	return r < 0 ? r : correct(fds, p, k, r);
}

/* Watch the rings, and the kernel every KERNEL_LOOK_NS, for one spin. */
static int spin(struct pollfd *fds, nfds_t n, const struct polled *p, int k)
{
	int way;
	long long until = spin_deadline(peers_cpu(p, k), &way), next;
	int r;

	if (!until)
		return 0;
	for (next = mono_now_ns() + KERNEL_LOOK_NS;;) {
		long long now;

		for (int i = 0; i < spin_looks(way, 16); i++) {
			if (rings_unread(p, k))
				return look_now(fds, n, p, k, NULL);
			spin_relax(way);
		}
		now = mono_now_ns();
		if (now >= next) {
			if ((r = look_now(fds, n, p, k, NULL)) != 0)
				return r;
			next = now + KERNEL_LOOK_NS;
		}
		if (now >= until)
			return 0;
	}
}

/* Sleep in the kernel as a sleeper of every ring (or not at all if one has bytes). */
static int sleep_once(struct pollfd *fds, nfds_t n, const struct polled *p, int k, int timeout,
                      const sigset_t *mask)
{
	int r, e;

	count_sleepers(p, k, 1);
	if (rings_unread(p, k)) {
		r = kernel_poll(fds, n, 0, mask);
	} else {
		epoll_watch_thread_sleeps();
		r = kernel_poll(fds, n, timeout, mask);
	}
	e = errno;
	count_sleepers(p, k, -1);
	errno = e;
	return r < 0 ? r : correct(fds, p, k, r);
}

static int wait_ready(struct pollfd *fds, nfds_t n, const struct polled *p, int k, int timeout,
                      const sigset_t *mask)
{
	long long deadline = mono_now_ns() + timeout * 1000000LL;
	int r = look_now(fds, n, p, k, mask);

	if (r != 0 || timeout == 0)
		return r;
	if (!mask && (r = spin(fds, n, p, k)) != 0)
		return r;
	for (;;) {
		if ((r = sleep_once(fds, n, p, k, timeout, mask)) != 0)
			return r;
		/* woken by stale doorbells only: wait for what is left */
		if (timeout > 0 && (timeout = (int)((deadline - mono_now_ns()) / 1000000)) <= 0)
			return 0;
	}
}

int pollwait(struct pollfd *fds, nfds_t n, int timeout, const sigset_t *mask)
{
	struct polled small[16], *p = n <= 16 ? small : malloc(n * sizeof(*p));
	int k, r, e;

	if (!p)
		return kernel_poll(fds, n, timeout, mask);
	k = gather(fds, n, p);
	r = wait_ready(fds, n, p, k, timeout, mask);
	e = errno;
	for (int j = 0; j < k; j++)
		if (p[j].c)
			conn_put(p[j].c);
	if (p != small)
		free(p);
	errno = e;
	return r;
}

/* ---- select ------------------------------------------------------------- */

/* What select() counts as ready for each set, as the kernel maps poll bits. */
#define SEL_IN  (POLLIN | POLLRDNORM | POLLRDBAND | POLLHUP | POLLERR)
#define SEL_OUT (POLLOUT | POLLWRNORM | POLLWRBAND | POLLERR)
#define SEL_EX  POLLPRI

int pollwait_select_needed(int nfds, const fd_set *rd)
{
	for (int fd = 0; rd && fd < nfds && fd < FD_SETSIZE; fd++)
		if (FD_ISSET(fd, rd) && (fd_has_conn(fd) || (fd_flags(fd) & FDF_EPOLL)))
			return 1;
	return 0;
}

static short select_events(int fd, const fd_set *rd, const fd_set *wr, const fd_set *ex)
{
	short ev = 0;

	if (rd && FD_ISSET(fd, rd))
		ev |= POLLIN | POLLRDNORM | POLLRDBAND;
	if (wr && FD_ISSET(fd, wr))
		ev |= POLLOUT | POLLWRNORM | POLLWRBAND;
	if (ex && FD_ISSET(fd, ex))
		ev |= POLLPRI;
	return ev;
}

static int select_result(const struct pollfd *p, int n, fd_set *rd, fd_set *wr, fd_set *ex)
{
	int count = 0;

	for (int i = 0; i < n; i++)
		if (p[i].revents & POLLNVAL) {
			errno = EBADF;
			return -1;
		}
	for (int i = 0; i < n; i++) {
		int fd = p[i].fd, in = rd && FD_ISSET(fd, rd), out = wr && FD_ISSET(fd, wr),
		    exc = ex && FD_ISSET(fd, ex);

		if (in && !(p[i].revents & SEL_IN))
			FD_CLR(fd, rd);
		if (out && !(p[i].revents & SEL_OUT))
			FD_CLR(fd, wr);
		if (exc && !(p[i].revents & SEL_EX))
			FD_CLR(fd, ex);
		count += (in && (p[i].revents & SEL_IN)) + (out && (p[i].revents & SEL_OUT)) +
		         (exc && (p[i].revents & SEL_EX));
	}
	return count;
}

int pollwait_select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout,
                    const sigset_t *mask)
{
	struct pollfd *p = malloc((size_t)nfds * sizeof(*p));
	int n = 0, r;

	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	for (int fd = 0; fd < nfds && fd < FD_SETSIZE; fd++) {
		short ev = select_events(fd, rd, wr, ex);
		if (ev) {
			p[n].fd = fd;
			p[n].events = ev;
			p[n++].revents = 0;
		}
	}
	r = pollwait(p, (nfds_t)n, timeout, mask);
	if (r >= 0)
		r = select_result(p, n, rd, wr, ex);
	free(p);
	return r;
}

/*
 * Under a seccomp filter (handshake/moved.c) every connection is on TCP;
 * only the bytes its ring still holds are ours to report.  How many of
 * @fds have such bytes; with @r (the kernel's answer to the program's own
 * call), those are added to it and the new count returned.
 */
int pollwait_moved_rings(struct pollfd *fds, nfds_t n, int r)
{
	int ready = 0;

	for (nfds_t i = 0; i < n; i++) {
		struct conn *c;

		if (fds[i].fd < 0 || !(fds[i].events & READ_EVENTS) || !fd_has_conn(fds[i].fd) ||
		    !(c = fd_get_conn(fds[i].fd)))
			continue;
		if (c->mode == MODE_SHM && rx_ring_readable(c)) {
			ready++;
			if (r >= 0) {
				r += fds[i].revents == 0;
				fds[i].revents |= fds[i].events & READ_EVENTS;
			}
		}
		conn_put(c);
	}
	return r >= 0 ? r : ready;
}

/*
 * The same for select() under a seccomp filter: how many of the read set
 * have ring bytes left (with @r < 0), or, after the program's own call
 * answered @r (its sets as the kernel left them in @rd), those marked too
 * and the new count.  @asked: the read set the program passed.
 */
int pollwait_moved_select(int nfds, const fd_set *asked, fd_set *rd, int r)
{
	int ready = 0;

	for (int fd = 0; asked && fd < nfds && fd < FD_SETSIZE; fd++) {
		struct conn *c;

		if (!FD_ISSET(fd, asked) || !fd_has_conn(fd) || !(c = fd_get_conn(fd)))
			continue;
		if (c->mode == MODE_SHM && rx_ring_readable(c)) {
			ready++;
			if (r >= 0 && rd && !FD_ISSET(fd, rd)) {
				FD_SET(fd, rd);
				r++;
			}
		}
		conn_put(c);
	}
	return r >= 0 ? r : ready;
}
