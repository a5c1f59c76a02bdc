/*
 * bell.c - doorbells: when to ring, how to make a full writer unwritable, and
 * which doorbells a reader may consume (protocol summary in io.h).
 *
 * A doorbell is counted in the writer's region *before* it is sent and the
 * count is taken back if the send fails or turns out to be unneeded, so a
 * reader that empties the ring can see a doorbell in flight and consume it
 * on arrival.  Without that, a doorbell arriving just after the reader
 * emptied the ring would make the descriptor readable with nothing to read,
 * and programs that trust readiness (wrk counts EAGAIN after EPOLLIN as an
 * error) would misbehave.
 */
#include "io.h"

#include "peerpool.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* One zero-length message, carrying @nfds descriptors of @fds. */
static ssize_t bell_message(int fd, const int *fds, int nfds)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(2 * sizeof(int))];
	} u;
	struct msghdr m = { .msg_control = u.buf };
	struct cmsghdr *cm;

	if (nfds == 0)
		return sys_send(fd, NULL, 0, MSG_NOSIGNAL | MSG_DONTWAIT);
	memset(&u, 0, sizeof(u));
	m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
	cm = CMSG_FIRSTHDR(&m);
	if (!cm) {
		errno = EINVAL;         /* cannot be: the buffer is sized for it */
		return -1;
	}
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	return sys_sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Ring once: count, send, take the count back on failure.  The doorbell
 * carries @nfds descriptors (bell_send_pool) or none. */
static int bell_send_fds(struct conn *c, int fd, int only_if_unread, const int *fds, int nfds)
{
	struct conn_shared *sh = c->sh;
	uint64_t seq = sh->bell_seq;

	atomic_store_explicit(&c->tx->bell_val[seq % BELL_LOG], sh->prod, memory_order_relaxed);
	atomic_store_explicit(&c->tx->bell_seq, seq + 1, memory_order_seq_cst);
	/* the reader may have consumed everything meanwhile: then no doorbell */
	if (only_if_unread && atomic_load_explicit(&c->rx->cons, memory_order_seq_cst) == sh->prod) {
		atomic_store_explicit(&c->tx->bell_seq, seq, memory_order_seq_cst);
		return 0;
	}
	if (bell_message(fd, fds, nfds) < 0) {
		int e = errno;
		atomic_store_explicit(&c->tx->bell_seq, seq, memory_order_seq_cst);
		/* after a move the doorbell socket is shut down on purpose */
		if ((e == EPIPE || e == ECONNRESET) && !move_flagged(c))
			atomic_fetch_or(&sh->flags, SH_PEER_GONE | SH_PEER_SHUT);
		return -e;
	}
	sh->bell_seq = seq + 1;
	sh->bell_last_val = sh->prod;
	if (c->slot)
		atomic_fetch_add_explicit(&c->slot->bells_sent, 1, memory_order_relaxed);
	return 0;
}

static int bell_send_once(struct conn *c, int fd, int only_if_unread)
{
	return bell_send_fds(c, fd, only_if_unread, NULL, 0);
}

int bell_send_pool(struct conn *c, int fd, int memfd, int wakefd)
{
	int fds[2] = { memfd, wakefd }, r;

	shared_lock(&c->sh->tx_lock);
	r = bell_send_fds(c, fd, 0, fds, 2);
	if (r == 0)     /* the reader may take it before the ring empties (rx.c) */
		atomic_store_explicit(&c->tx->pool_bell, c->sh->bell_seq, memory_order_release);
	shared_unlock(&c->sh->tx_lock);
	return r;
}

/*
 * Does a reader that is awake make this doorbell unnecessary?  Either it
 * spins in a blocking read that takes all @unread bytes (rx.c), or an epoll
 * wait of its process is watching the ring and will report the bytes itself
 * (epoll_watch.c), while nobody of it sleeps in the kernel on the doorbell socket.
 * The loads are seq_cst after our producer cursor was: with the reader's
 * stop-watching-then-look, either we see the promise gone, or it sees bytes.
 */
static int reader_watching(struct conn *c, uint64_t unread)
{
	const struct ring_hdr *r = c->rx;

	if (unread <= atomic_load_explicit(&r->spin_take, memory_order_seq_cst))
		return 1;
	/* asleep on the futex in a read that takes it all: the wake-up is enough */
	if (unread <= atomic_load_explicit(&r->futex_take, memory_order_seq_cst) &&
	    atomic_load_explicit(&r->sleepers, memory_order_seq_cst) == 0)
		return 1;
	return atomic_load_explicit(&r->watchers, memory_order_seq_cst) != 0 &&
	       atomic_load_explicit(&r->sleepers, memory_order_seq_cst) == 0;
}

/*
 * A reader that wants an edge for every produce (bell_each) gets a doorbell
 * for each while at most this many are queued: more would make our doorbell
 * socket unwritable (SIDE_SNDBUF), which reads as a full ring to a program
 * waiting for POLLOUT.  It takes them as it reads (rx.c: after_consume).
 */
#define BELL_EACH_MAX 3

static uint64_t bells_outstanding(struct conn *c)
{
	return c->sh->bell_seq - atomic_load_explicit(&c->rx->bells_drained, memory_order_relaxed);
}

/*
 * A reader with SO_RCVLOWAT above 1 sleeps through a doorbell that told it
 * of fewer bytes (poll and epoll do not report it readable): the next one
 * goes when its unread bytes reach the mark.  The mark is the reader's word
 * in its own header: any value only chooses when we ring.
 */
static int lowat_reached(struct conn *c, uint64_t peer_cons)
{
	uint64_t lowat = atomic_load_explicit(&c->rx->lowat, memory_order_relaxed);

	return lowat > 1 && c->sh->prod - peer_cons >= lowat &&
	       c->sh->bell_last_val - peer_cons < lowat;
}

static void bell_skipped(struct conn *c)
{
	if (c->slot)
		atomic_fetch_add_explicit(&c->slot->bells_skipped, 1, memory_order_relaxed);
}

void bell_after_produce(struct conn *c, int fd)
{
	struct conn_shared *sh = c->sh;
	uint64_t peer_cons;

	spin_note_cpu(&c->tx->cpu);     /* where the reader's wait looks for us */
	bell_wake_sleeper(c);
	if (move_flagged(c))
		return;                 /* no doorbells after a move (move.c) */

	if (bells_outstanding(c) >= BELL_LOG - 1)
		return;                 /* the reader has plenty queued already */
	/* a reader watching for all we wrote since the cursor we saw last is
	 * watching for what is unread now: its cursor's line, which it writes
	 * as it reads, is left alone (a round trip of a cache line saved) */
	if ((int64_t)(sh->ref_end - sh->peer_cons_seen) <= 0 &&
	    reader_watching(c, sh->prod - sh->peer_cons_seen)) {
		bell_skipped(c);
		return;
	}
	/* pairs with the reader's publish-cons-then-load-prod (Dekker) */
	peer_cons = atomic_load_explicit(&c->rx->cons, memory_order_seq_cst);
	if (ring_cons_valid(sh->peer_cons_seen, peer_cons, sh->prod))
		sh->peer_cons_seen = peer_cons;         /* fetched anyway: the room, the next skip */
	if (sh->bell_seq != 0 && sh->bell_last_val > peer_cons &&
	    (!atomic_load_explicit(&c->rx->bell_each, memory_order_relaxed) ||
	     bells_outstanding(c) >= BELL_EACH_MAX) && !lowat_reached(c, peer_cons))
		return;                 /* our last doorbell is still live */
	if (peer_cons == sh->prod)
		return;                 /* the reader already took everything */
	/* a reference not consumed yet stands for more bytes than its one
	 * byte of ring: no read's promise to take it all can be checked */
	if (reader_watching(c, (int64_t)(sh->ref_end - peer_cons) > 0 ? UINT64_MAX
	                                                             : sh->prod - peer_cons)) {
		bell_skipped(c);
		return;
	}
	bell_send_once(c, fd, 1);
}

/* ---- a reader asleep on the futex (rx.c) ------------------------------- */

void bell_wake_word(_Atomic uint32_t *word)
{
	atomic_fetch_add_explicit(word, 1, memory_order_seq_cst);
	sys_futex_wake(word);
}

void bell_wake_sleeper(struct conn *c)
{
	/* the region is mapped writable by both; the word is the reader's */
	if (atomic_load_explicit(&c->rx->futex_take, memory_order_seq_cst))
		bell_wake_word((_Atomic uint32_t *)&c->rx->wake_seq);
}

/*
 * A socket read interrupted by a signal handler is restarted by the kernel
 * when the handler has SA_RESTART.  We do not learn which signal came, so we
 * restart only if every handler installed has it; otherwise the read fails
 * with EINTR as it would have for that signal.
 */
/* Raised by a fault of the thread itself, so never while it sleeps in a
 * system call; sanitizers and crash reporters install handlers for them
 * without SA_RESTART, which must not turn every wait into EINTR. */
static int fault_signal(int sig)
{
	return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL ||
	       sig == SIGTRAP || sig == SIGSYS;
}

int bell_signals_restart(void)
{
	int e = errno, restart = 1;

	/* sigaction() fails (EINVAL) for the signals libc keeps to itself:
	 * the caller's errno must survive the look */
	for (int sig = 1; sig < NSIG && restart; sig++) {
		struct sigaction sa;

		if (fault_signal(sig))
			continue;
		if (sigaction(sig, NULL, &sa) == 0 && !(sa.sa_flags & SA_RESTART) &&
		    sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN)
			restart = 0;
	}
	errno = e;
	return restart;
}

/*
 * A crashed writer wakes no futex, and a signal that arrives between two
 * waits would not interrupt the next, so the futex is only the first
 * SLEEP_TICK_MS of a sleep: a round trip is far shorter, and a reader still
 * waiting after that goes on sleeping on the doorbell socket, where the
 * kernel reports hang-ups and signals exactly.
 */
#define SLEEP_TICK_MS 20

int bell_sleep(struct conn *c, int fd, uint32_t seq)
{
	int timeo = io_rcvtimeo_ms(c, fd);
	int ms = timeo > 0 && timeo < SLEEP_TICK_MS ? timeo : SLEEP_TICK_MS;
	long long end = mono_now_ms() + ms;

	for (;;) {
		long long left = end - mono_now_ms();
		struct timespec t = { .tv_nsec = 1000000L * (left > 0 ? left : 0) };

		if (left <= 0)
			return ms == timeo ? -EAGAIN : BELL_SLEEP_ON;
		if (sys_futex_wait(&c->tx->wake_seq, seq, &t) == 0 ||
		    errno == EAGAIN)
			return 0;                       /* woken, or the word moved on */
		if (errno == EINTR && !bell_signals_restart())
			return -EINTR;
		if (errno != EINTR && errno != ETIMEDOUT)
			return 0;
	}
}


/*
 * The doorbell socket's send buffer (SIDE_SNDBUF) leaves the descriptor
 * writable with up to 4 doorbells queued; 6 make it unwritable with one to
 * spare.  More would only be more system calls for the reader to undo.
 */
#define FILL_TARGET 6

void bell_fill(struct conn *c, int fd)
{
	while (!move_flagged(c) && bells_outstanding(c) < FILL_TARGET &&
	       bell_send_once(c, fd, 0) == 0)
		;
}

/*
 * A peer that claims ~2^62 doorbells and closes its end would have us count
 * every end-of-file recv() as one, for ever (found by tests/fuzz/fuzz_ring).
 * Every DRAIN_LOOK doorbells the drain asks whether the socket hung up or
 * the peer shut its sending side (then recv() returns 0 for ever too), and
 * stops if so: after that nothing it drains can matter.
 */
#define DRAIN_LOOK 64

/*
 * Consume one doorbell.  No room for a byte: a message with bytes is a
 * protocol breach, seen as truncated (1 returned); and should another
 * thread have made @fd the TCP socket after a move (core/move.c), a
 * zero-length read takes nothing from its stream.  A doorbell may carry
 * the peer's pool (bell_send_pool): its descriptors go to peerpool_adopt,
 * which keeps or closes them - read without room for them, the kernel
 * would close them unseen.
 */
static ssize_t bell_take(struct conn *c, int fd, char *b)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(2 * sizeof(int))];
	} u;
	struct iovec v = { b, 0 };
	struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1,
	                    .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	ssize_t n = sys_recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0 && errno != EAGAIN && errno != EINTR)
		/* it cannot fail otherwise for a doorbell, but a seccomp filter
		 * can make it: the doorbell still goes (its descriptors, if any,
		 * with it - a pool refused) */
		return sys_recv(fd, b, 0, MSG_DONTWAIT);
	if (n == 0 && (m.msg_flags & MSG_TRUNC))
		n = 1;                  /* bytes where only doorbells belong */
	if (n >= 0 && m.msg_controllen) {
		int fds[2] = { -1, -1 }, got = 0;

		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k; i++) {
				int d;
				memcpy(&d, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
				if (got < 2)
					fds[got++] = d;
				else
					sys_close(d);   /* more than a pool has */
			}
		}
		if (got)
			peerpool_adopt(c, got == 2 ? fds[0] : -1, got == 2 ? fds[1] : fds[0]);
	}
	return n;
}

static void drain(struct conn *c, int fd, int keep_one, uint64_t live);

void bell_drain(struct conn *c, int fd, int keep_one)
{
	drain(c, fd, keep_one, 0);
}

void bell_drain_live(struct conn *c, int fd, uint64_t lowat)
{
	drain(c, fd, 0, lowat);
}

/* @live: take doorbells for unread bytes too, all but those that say
 * @live bytes are there (rung for a reader's SO_RCVLOWAT mark). */
static void drain(struct conn *c, int fd, int keep_one, uint64_t live)
{
	struct conn_shared *sh = c->sh;
	int in_flight_waits = 0, drained = 0;

	if (move_flagged(c))
		return;                 /* @fd may be the TCP socket by now (move.c) */
	for (;;) {
		uint64_t i = sh->bells_drained;
		uint64_t seq = atomic_load_explicit(&c->rx->bell_seq, memory_order_seq_cst);
		uint64_t val;
		char b;
		ssize_t n;

		if (seq - i == 0 || seq - i > (1ull << 62))
			break;                          /* none counted (or nonsense) */
		if (keep_one && seq - i == 1)
			break;                          /* the last one keeps us readable */
		if (move_flagged(c))
			break;                          /* moved meanwhile: nothing to drain */
		/* an entry older than the log was overwritten: its data is older still */
		val = seq - i > BELL_LOG ? 0 :
		      atomic_load_explicit(&c->rx->bell_val[i % BELL_LOG], memory_order_relaxed);
		if (!keep_one && !live && val > sh->cons)
			break;                          /* live: covers unread data */
		if (live && val > sh->cons && val - sh->cons >= live)
			break;                          /* rung for the mark: keeps us readable */
		n = bell_take(c, fd, &b);
		if (n < 0 && errno == EAGAIN) {
			/* counted but not arrived: being sent right now, or taken back */
			if (keep_one || ++in_flight_waits > 200)
				break;
			__builtin_ia32_pause();
			continue;
		}
		if (n != 0) {
			if (n > 0)
				close_mark_broken(c);    /* bytes where only doorbells belong */
			break;
		}
		sh->bells_drained = i + 1;
		atomic_store_explicit(&c->tx->bells_drained, i + 1, memory_order_relaxed);
		if (++drained % DRAIN_LOOK == 0 && bell_hangup_flags(c, fd))
			break;
	}
}

int bell_wait_writable(int fd, int dontwait)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	struct timeval tv = { 0 };
	socklen_t l = sizeof(tv);
	int timeout = -1, rc;

	if (dontwait || (sys_fcntl(fd, F_GETFL, 0) & O_NONBLOCK)) {
		/*
		 * A full ring whose reader is gone never drains: the writer
		 * must hear EPIPE, not EAGAIN until its own timeout (its
		 * poll() for POLLOUT returns at once, with POLLHUP).
		 */
		if (sys_poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)))
			return -EPIPE;
		return -EAGAIN;
	}
	if (sys_getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &l) == 0 && (tv.tv_sec || tv.tv_usec))
		timeout = (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
	io_thread_sleeps();
	for (;;) {
		long long start = mono_now_ms();

		rc = sys_poll(&p, 1, timeout);
		if (rc >= 0 || errno != EINTR || !bell_signals_restart())
			break;
		/* a handler with SA_RESTART: the kernel's send would go on waiting */
		if (timeout > 0 && (timeout -= (int)(mono_now_ms() - start)) <= 0) {
			rc = 0;
			break;
		}
	}
	if (rc < 0)
		return -errno;
	if (rc == 0)
		return -EAGAIN;         /* SO_SNDTIMEO expired */
	if (p.revents & (POLLHUP | POLLERR))
		return -EPIPE;
	return 0;
}

uint32_t bell_hangup_flags(const struct conn *c, int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };

	if (move_flagged(c) || sys_poll(&p, 1, 0) != 1)
		return 0;
	return tcpend_hangup_flags(c, p.revents);
}
