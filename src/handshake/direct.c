/*
 * direct.c - listeners that take connections without TCP: the switch of a
 * blocking listener to direct and back (for good), and accept()'s wait on
 * the listener and its direct inbox together.
 */
#include "hs_internal.h"

#include "io.h"
#include "region.h"
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>

/*
 * A blocking listener goes direct once an accept() on it took an smclo
 * client's offer: its process waits in accept(), so accept() can wait on
 * the listener and on a direct inbox of the listener's own together, and
 * the client need not make a TCP connection to wake it (design.md §2d).
 * The listener's entry is made again, naming that inbox; clients that see
 * it send a CLC_DIRECT offer there and no SYN.  Anything that waits for the listener where accept() cannot see
 * (epoll, poll, select), makes it non-blocking or gives it a receive
 * timeout takes it back to TCP for good (hs_listener_no_direct): its entry
 * is made again without the inbox, and offers queued there are declined so
 * their clients connect over TCP at once.
 */

/* A new entry for listener @fd naming @direct (0: none) replaces its entry. */
static int listener_reregister(int fd, uint64_t direct)
{
	struct listener_offer offer = { .inbox = inbox_id(), .direct = direct,
	                                .tx_size = cfg.tx_size, .rx_max = cfg.rx_max };
	int lock = offer.inbox ? listener_register(fd, &offer) : -1, old;

	if (lock < 0)
		return -1;
	old = fd_take_listen_lock(fd);
	fd_set_listen_lock(fd, lock);
	if (old >= 0)
		registry_lock_remove(registry_fd, "l", old);
	return 0;
}

/*
 * Threads inside accept()'s kernel wait on a listener, or about to enter
 * it, are counted in its descriptor's entry.  Such a thread would not see a
 * direct offer, and a client whose offer nobody sees waits out its
 * handshake timeout; so a listener goes direct only while none is there.
 * The waiter counts itself before it looks at FDF_DIRECT, the switch sets
 * FDF_DIRECT before it looks at the count (both sequentially consistent):
 * one of them sees the other.
 */
void hs_kernel_accept(int lfd, int delta)
{
	fd_kernel_accepts(lfd, delta);
	atomic_thread_fence(memory_order_seq_cst);
}

static int kernel_accepts(int lfd)
{
	return fd_kernel_accepts(lfd, 0);
}

/* An offer queued when the listener went back to TCP: its client connects over TCP now. */
static void direct_refuse(const union clc_msg *m, int fds[OFFER_FDS])
{
	struct region *r = NULL;
	uid_t owner;

	if (m->accept.ring_size <= cfg.rx_max && m->accept.rx_max <= cfg.tx_size)
		r = region_map(fds[OFFER_FD_REGION], m->accept.ring_size, m->accept.rx_max, &owner);
	if (r) {
		inbox_offer_decide(region_up(r), OFFER_DECLINED | (uint32_t)R_DIRECT_ENDED << 8);
		region_put(r, 0);
	}
	sys_close_all(fds, OFFER_FDS);
}

/* Listener @fd takes connections through TCP again (direct_lock held). */
static void listener_leave_direct(int fd)
{
	listener_reregister(fd, 0);
	fd_set_flags(fd, fd_flags(fd) & ~FDF_DIRECT);
	inbox_direct_close(fd, direct_refuse);
	DBG("listen fd %d: back to TCP only", fd);
}

/*
 * Going direct and back are rare and a few system calls each; one lock
 * orders them, so a listener that is polled while another thread makes it
 * direct ends up back on TCP, never both.
 */
static pthread_mutex_t direct_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * Held across fork() (runtime/fork.c), direct_lock first: it is held
 * around calls that take inbox.c's locks.
 */
void hs_fork_lock(void)
{
	inbox_fork_prepare();           /* takes inbox_lock itself: before the locks */
	pthread_mutex_lock(&direct_lock);
	inbox_fork_lock();
}

void hs_fork_unlock(void)
{
	inbox_fork_unlock();
	pthread_mutex_unlock(&direct_lock);
}

/* Make blocking listener @lfd direct, or mark it never to be (lock held). */
static void listener_go_direct_locked(int lfd)
{
	struct timeval tv = { 0 };
	socklen_t l = sizeof(tv);
	int fl;
	struct ep addr;
	uint64_t id;

	if ((fd_flags(lfd) & (FDF_LISTENING | FDF_DIRECT | FDF_NO_DIRECT)) != FDF_LISTENING ||
	    server_precheck() != R_NONE || proof_io_uring_any() || kernel_accepts(lfd) > 0)
		return;         /* not now (io_uring, too many connections, another thread
		                   waits in the kernel), or decided already */
	fl = sys_fcntl(lfd, F_GETFL, 0);
	if (!cfg.direct || fl < 0 || (fl & O_NONBLOCK) || !listener_entry_believed(lfd) ||
	    sys_getsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) < 0 || tv.tv_sec || tv.tv_usec ||
	    ep_of_socket(lfd, 0, &addr) < 0)
		goto never;
	if (!(id = inbox_direct_open(lfd, &addr, proof_netns_cookie(lfd))))
		goto never;
	if (listener_reregister(lfd, id) < 0) {
		inbox_direct_close(lfd, direct_refuse);
		goto never;
	}
	fd_add_flags(lfd, FDF_DIRECT);
	if (kernel_accepts(lfd) > 0) {         /* one came meanwhile: not now */
		listener_leave_direct(lfd);
		return;
	}
	DBG("listen fd %d: takes connections without TCP (direct inbox %llx)", lfd,
	    (unsigned long long)id);
	return;
never:
	fd_add_flags(lfd, FDF_NO_DIRECT);
}

/*
 * After listener @lfd took an smclo client's offer: the next ones may come
 * without TCP.  Only then, so a server of plain clients never pays the
 * poll() a direct accept() makes.
 */
void direct_listener_go(int lfd)
{
	if ((fd_flags(lfd) & (FDF_LISTENING | FDF_DIRECT | FDF_NO_DIRECT)) != FDF_LISTENING)
		return;
	pthread_mutex_lock(&direct_lock);
	listener_go_direct_locked(lfd);
	pthread_mutex_unlock(&direct_lock);
}

void hs_listener_no_direct(int fd)
{
	uint16_t f = fd_flags(fd);

	if (!(f & FDF_LISTENING) || (f & FDF_NO_DIRECT))
		return;
	pthread_mutex_lock(&direct_lock);
	fd_add_flags(fd, FDF_NO_DIRECT);
	if (fd_flags(fd) & FDF_DIRECT)
		listener_leave_direct(fd);
	pthread_mutex_unlock(&direct_lock);
}

void direct_listener_closed(int fd)
{
	pthread_mutex_lock(&direct_lock);
	if (fd_flags(fd) & FDF_DIRECT)
		inbox_direct_close(fd, direct_refuse);
	fd_set_flags(fd, fd_flags(fd) & ~(FDF_LISTENING | FDF_DIRECT));
	pthread_mutex_unlock(&direct_lock);
}

/* The next direct offer in @dsock taken: the application's fd, or -1 when none is queued. */
static int direct_take_next(int lfd, int dsock, const struct ep *addr, uint64_t netns,
                            int flags, struct ep *peer)
{
	struct server sv;
	union clc_msg m;
	int fds[OFFER_FDS], fd = -1;

	do {
		if (clc_recv(dsock, CLC_DIRECT, 0, &m, fds, OFFER_FDS) < 0) {
			if (errno == EPROTO)
				continue;       /* not an offer: dropped, descriptors closed */
			return -1;
		}
		sv = (struct server){ .fd = -1, .lfd = lfd, .direct = 1, .flags = flags, .s = -1,
		                      .netns = netns, .listen_addr = *addr };
		memcpy(sv.local.ip, m.direct.dst_ip, sizeof(sv.local.ip));
		sv.local.port = m.direct.dst_port;
		fd = server_take_offer(&sv, &m, fds);
	} while (fd < 0);
	*peer = sv.peer;
	return fd;
}

int hs_accept_direct(int lfd, int flags, struct ep *peer)
{
	for (;;) {
		struct ep addr;
		uint64_t netns;
		int dsock = inbox_direct_sock(lfd, &addr, &netns), fd;
		struct pollfd p[2] = { { .fd = lfd, .events = POLLIN },
		                       { .fd = dsock, .events = POLLIN } };

		if (dsock < 0)
			return HS_ACCEPT_KERNEL;        /* back to TCP meanwhile */
		/* as accept() would sleep: a restarting signal goes on, any other ends it */
		if (sys_poll(p, 2, -1) < 0) {
			if (errno == EINTR && bell_signals_restart())
				continue;
			return -1;
		}
		/* the inbox first: what the kernel queued stays queued */
		if (p[1].revents &&
		    (fd = direct_take_next(lfd, dsock, &addr, netns, flags, peer)) >= 0)
			return fd;
		if (p[0].revents)
			return HS_ACCEPT_KERNEL;
	}
}
