/*
 * rx.c - receive: copy bytes out of the peer's ring (mapped read-only).
 *
 * Every cursor and flag read from the peer is checked before use; a peer
 * that breaks the rules gets its connection reset, never an out-of-bounds
 * read from us.  Blocking waits are a blocking MSG_PEEK recv on the doorbell
 * socket, so SO_RCVTIMEO, SA_RESTART and EINTR behave exactly as the kernel
 * makes them behave for any socket.
 */
#include "io.h"

#include "log.h"
#include "peerpool.h"
#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

int rx_peer_prod(struct conn *c, uint64_t *prod)
{
	struct conn_shared *sh = c->sh;
	uint64_t p = atomic_load_explicit(&c->rx->prod, memory_order_seq_cst);

	if (atomic_load_explicit(&sh->flags, memory_order_acquire) & SH_RESEND) {
		*prod = sh->cons;       /* the rest comes again over TCP (move.c) */
		return 0;
	}
	if (ring_prod_sealed(p, sh->cons, c->rx_size))
		p -= RING_PROD_MOVED;   /* the stream goes on over TCP after it (move.c) */
	if (!ring_prod_valid(sh->cons, sh->peer_prod_seen, p, c->rx_size)) {
		close_mark_broken(c);
		return -1;
	}
	sh->peer_prod_seen = p;
	*prod = p;
	return 0;
}

static void publish_cons(struct conn *c)
{
	struct conn_shared *sh = c->sh;

	sh->cons_pub = sh->cons;
	atomic_store_explicit(&c->tx->cons, sh->cons, memory_order_seq_cst);
	spin_note_cpu(&c->tx->cpu);     /* the same line: where a writer waiting for room looks */
}

/* Does a doorbell we have not drained carry the peer's pool, with another
 * doorbell after it?  (The peer's word: a lie costs it our drains until
 * we pass it, then nothing.) */
static int pool_waits(const struct conn *c)
{
	uint64_t at = atomic_load_explicit(&c->rx->pool_bell, memory_order_acquire);

	return !c->rx_pool && at > c->sh->bells_drained &&
	       atomic_load_explicit(&c->rx->bell_seq, memory_order_relaxed) > at;
}

/*
 * After consuming up to sh->cons with the producer seen at @prod: tell the
 * writer what it needs to know and consume doorbells we no longer need.
 */
static void after_consume(struct conn *c, int fd, uint64_t prod, int refs_done)
{
	struct conn_shared *sh = c->sh;

	if (c->slot)
		c->slot->rx_fill = (uint32_t)(prod - sh->cons);
	if (move_flagged(c)) {
		publish_cons(c);        /* nobody writes to the ring or rings any more */
		return;
	}
	if (refs_done) {
		/* buffers of the peer's pool are free again: the cursor says
		 * which, its wake-up socket says to look */
		publish_cons(c);
		peerpool_released(c);
	}
	if (sh->cons != prod && pool_waits(c)) {
		/* the peer's pool came on a doorbell before the last one: take
		 * it now, so that the peer's next sends go by reference, not
		 * when the ring next runs empty (the last doorbell stays) */
		publish_cons(c);
		bell_drain(c, fd, 1);
	}
	if (sh->cons == prod) {
		uint64_t again;

		publish_cons(c);
		if (rx_peer_prod(c, &again) == 0 && again == sh->cons)
			bell_drain(c, fd, 0);   /* empty: stale doorbells go */
	} else if (atomic_load_explicit(&c->rx->write_blocked, memory_order_relaxed) &&
	           sh->cons - sh->cons_woke >= c->rx_size / 4) {
		/* wake a blocked writer only for real room, as the kernel does:
		 * waking it for every small read costs a doorbell storm */
		publish_cons(c);
		bell_drain(c, fd, 1);           /* wake the writer, stay readable */
		sh->cons_woke = sh->cons;
	} else if (atomic_load_explicit(&c->tx->bell_each, memory_order_relaxed) &&
	           atomic_load_explicit(&c->rx->bell_seq, memory_order_relaxed) - sh->bells_drained > 1) {
		/* a doorbell for every produce (edges, O_ASYNC: bell.c) fills the
		 * writer's doorbell socket unless we take them as we read */
		publish_cons(c);
		bell_drain(c, fd, 1);
	} else if (sh->cons - sh->cons_pub >= c->rx_size / 10) {
		publish_cons(c);                /* the kernel's 10% rule */
	}
}

/*
 * The stream as the reader walks it.  Pool references (ring.h) make it a
 * sequence of runs: plain bytes of the ring, or the rest of a buffer of the
 * peer's pool that a reference stands for (its one placeholder byte in the
 * ring is skipped).  A position is our cursor, the references consumed and
 * the bytes taken of the one at the cursor; the cursor passes a
 * placeholder only once its buffer is read to the end, so the cursor the
 * writer sees releases exactly the buffers we are done with.
 */
struct rx_at {
	uint64_t cons;
	uint64_t ref;
	uint32_t skip;
};

struct rx_run {
	const uint8_t *pool;    /* the buffer's bytes, or NULL: ring bytes at the cursor */
	size_t len;
};

static void rx_at_load(const struct conn_shared *sh, struct rx_at *at)
{
	*at = (struct rx_at){ sh->cons, sh->ref_cons, sh->ref_skip };
}

/* Our position moves under the receive lock, as a sequence lock: a count
 * without the lock (rx_available while a peek holds it) must never see
 * one field moved and another not - that looks like a forged reference. */
static void rx_at_store(struct conn_shared *sh, const struct rx_at *at)
{
	uint32_t seq = atomic_load_explicit(&sh->at_seq, memory_order_relaxed);

	/* each field a release: whoever sees it moved sees the count odd */
	atomic_store_explicit(&sh->at_seq, seq + 1, memory_order_relaxed);
	__atomic_store_n(&sh->cons, at->cons, __ATOMIC_RELEASE);
	__atomic_store_n(&sh->ref_cons, at->ref, __ATOMIC_RELEASE);
	__atomic_store_n(&sh->ref_skip, at->skip, __ATOMIC_RELEASE);
	atomic_store_explicit(&sh->at_seq, seq + 2, memory_order_release);
}

/* Our position without the lock: 0, or -1 if it kept moving. */
static int rx_at_snapshot(const struct conn_shared *sh, struct rx_at *at)
{
	for (int tries = 0; tries < 64; tries++) {
		uint32_t seq = atomic_load_explicit(&sh->at_seq, memory_order_acquire);

		if (seq & 1)
			continue;
		/* acquires: the second look at the count comes after them */
		at->cons = __atomic_load_n(&sh->cons, __ATOMIC_ACQUIRE);
		at->ref = __atomic_load_n(&sh->ref_cons, __ATOMIC_ACQUIRE);
		at->skip = __atomic_load_n(&sh->ref_skip, __ATOMIC_ACQUIRE);
		if (atomic_load_explicit(&sh->at_seq, memory_order_relaxed) == seq)
			return 0;
	}
	return -1;
}

/*
 * The run at @at with the peer's producer at @prod (validated).  0, or -1
 * when the peer forged its references (the connection is reset, if
 * @judge: a count without the lock leaves that to the reader).  Every
 * field of the peer's is read once and checked before use: a reference may
 * only name bytes inside the pool we mapped, at a placeholder we have not
 * passed.
 */
static int rx_run_at(struct conn *c, const struct rx_at *at, uint64_t prod, struct rx_run *run,
                     int judge)
{
	uint64_t refs = atomic_load_explicit(&c->rx->ref_prod, memory_order_acquire);
	const struct ring_ref *e;
	uint64_t pos;
	uint32_t off, len;

	run->pool = NULL;
	run->len = (size_t)(prod - at->cons);
	if ((refs == at->ref || run->len == 0) && !at->skip)
		return 0;               /* no reference outstanding, or nothing to read yet */
	if (refs - at->ref > RING_REFS || refs == at->ref)
		goto forged;
	e = &c->rx->ref[at->ref % RING_REFS];
	pos = atomic_load_explicit(&e->pos, memory_order_relaxed);
	off = atomic_load_explicit(&e->off, memory_order_relaxed);
	len = atomic_load_explicit(&e->len, memory_order_relaxed);
	switch (ring_ref_check(pos, off, len, at->cons, at->skip, prod,
	                       c->rx_pool ? c->rx_pool_len : 0)) {
	case REF_LATER:
		return 0;
	case REF_AHEAD:
		run->len = (size_t)(pos - at->cons);
		return 0;
	case REF_HERE:
		run->pool = c->rx_pool + off + at->skip;
		run->len = len - at->skip;
		return 0;
	case REF_BAD:
		break;
	}
forged:
	if (judge)
		close_mark_broken(c);
	return -1;
}

/* Move @at past @n bytes of its run @run (n <= run->len). */
static void rx_at_advance(struct rx_at *at, const struct rx_run *run, size_t n)
{
	if (!run->pool) {
		at->cons += n;
		return;
	}
	at->skip += (uint32_t)n;
	if (n == run->len) {
		at->skip = 0;
		at->ref++;
		at->cons++;             /* its placeholder */
	}
}

/* Copy @len bytes of @run (at stream position @pos) to the iovec at byte @skip. */
static void copy_to_iov(struct conn *c, const struct iovec *iov, int iovcnt, size_t skip,
                        const struct rx_run *run, uint64_t pos, size_t len)
{
	const uint8_t *src = run->pool;

	for (int i = 0; i < iovcnt && len; i++) {
		size_t n;

		if (skip >= iov[i].iov_len) {
			skip -= iov[i].iov_len;
			continue;
		}
		n = iov[i].iov_len - skip;
		if (n > len)
			n = len;
		if (src) {
			memcpy((char *)iov[i].iov_base + skip, src, n);
			src += n;
		} else {
			ring_copy_out((char *)iov[i].iov_base + skip, ring_data_ro(c->rx), c->rx_size,
			              pos, n);
			pos += n;
		}
		len -= n;
		skip = 0;
	}
}

/*
 * Take up to @want bytes of the stream from @at (moved past them), copied
 * into @iov from its byte @skip (@iov NULL: only passed over).  Returns the
 * bytes taken, or -1 when the peer forged the reference they would come
 * from (bytes before a forged one are taken; the connection is reset for
 * the next call).
 */
static long rx_take(struct conn *c, const struct iovec *iov, int iovcnt, size_t skip,
                    struct rx_at *at, uint64_t prod, size_t want, int judge)
{
	size_t done = 0;

	while (done < want) {
		struct rx_run run;
		size_t n;

		if (rx_run_at(c, at, prod, &run, judge) < 0)
			return done ? (long)done : -1;  /* the bytes before it were sound */
		if (run.len == 0)
			break;
		n = run.len < want - done ? run.len : want - done;
		if (iov)
			copy_to_iov(c, iov, iovcnt, skip + done, &run, at->cons, n);
		rx_at_advance(at, &run, n);
		done += n;
	}
	return (long)done;
}

/* A read or consume took @n bytes and moved to @at: account for them. */
static void rx_took(struct conn *c, int fd, const struct rx_at *at, uint64_t prod, size_t n)
{
	struct conn_shared *sh = c->sh;
	int refs = (int)(at->ref - sh->ref_cons);

	rx_at_store(sh, at);
	conn_count_call(c, CONN_READ);
	if (c->slot)
		atomic_fetch_add_explicit(&c->slot->rx_bytes, n, memory_order_relaxed);
	after_consume(c, fd, prod, refs);
}

/*
 * What the peer's flags mean for a reader that found the ring empty: 0 (wait
 * for more), 1 (end of stream), RX_END_MOVED (the rest comes over TCP) or
 * RX_END_RESET (rx_end_read says what a read returns).
 */
#define RX_END_MOVED 2
#define RX_END_RESET 3
static int rx_end_state(struct conn *c, uint32_t peer_flags)
{
	uint32_t f = atomic_load(&c->sh->flags);

	if (tcpend_reset(c))
		return RX_END_RESET;
	/* asked to be sent again (move.c): the peer's end comes over TCP too */
	if (f & SH_RESEND)
		peer_flags &= ~(RING_F_SHUTDOWN | RING_F_CLOSED);
	if (peer_flags & (RING_F_SHUTDOWN | RING_F_CLOSED) || f & SH_SHUT_RD)
		return 1;       /* end of stream */
	/* a close or shutdown the peer published came before any move: the
	 * ring's end is the stream's; after a move they go over TCP (and the
	 * doorbell socket's hang-up is the move's, not the peer's) */
	if (move_seen(c))
		return RX_END_MOVED;
	if (atomic_load(&c->sh->flags) & SH_PEER_SHUT)
		return 1;
	return 0;
}

/* rx_end_state for a read: a reset's pending error once (tcpend.c), then
 * the end of the stream; -errno, 0, 1 or RX_END_MOVED. */
static int rx_end_read(struct conn *c, uint32_t peer_flags)
{
	int end = rx_end_state(c, peer_flags), err;

	if (end != RX_END_RESET)
		return end;
	err = tcpend_read_error(c);
	return err ? -err : 1;
}

/* How a reader that found the ring empty sleeps (or 'look again'). */
enum { LOOK_AGAIN = -1, SLEEP_PEEK, SLEEP_FUTEX };

/*
 * A blocking read that nothing else waits beside (no epoll set of ours holds
 * the descriptor, no other process does) sleeps on a futex word in its ring
 * header instead of the doorbell socket: the writer wakes it and, when the
 * read takes every unread byte, sends no doorbell, so a sleeping round trip
 * costs one futex wait and one wake.  With the cores oversubscribed that is
 * measured at half the round trip of a socket wake-up (docs/performance.md).
 * Bytes such a read leaves unread have no doorbell, which is fine: every
 * later wait of ours (a read, poll, select, an epoll registration) looks at
 * the ring.
 */
static int futex_ok(struct conn *c, size_t take)
{
	return take > 0 && c->watch_regs == 0 &&
	       !atomic_load_explicit(&c->sh->nonblock, memory_order_relaxed) &&
	       atomic_load_explicit(&c->sh->holders, memory_order_relaxed) == 1;
}

/*
 * A blocking reader watches the ring before it sleeps (spin.h).  While it
 * does, it tells the writer how much its read will take (@take; 0 for a
 * peek, which consumes nothing): a writer whose unread bytes all fit needs
 * no doorbell, because this read takes them all and the descriptor is left
 * with nothing unread — exactly what its readiness then says.  Then it
 * leaves the promise it sleeps under - futex_take (@futex, if no other
 * thread holds it; *@seq is the word to wait on) or a count among the
 * sleepers, for whom writers always ring - withdraws the spin offer and
 * looks at the producer once more: with the writer's publish-then-look
 * (both seq_cst) either the writer saw the promise, or we see its bytes.
 * Returns LOOK_AGAIN, SLEEP_PEEK or SLEEP_FUTEX.
 */
static int rx_spin(struct conn *c, size_t take, int futex, uint32_t *seq)
{
	struct conn_shared *sh = c->sh;
	uint32_t none = 0;
	uint64_t prod;
	int changed;

	if (take > UINT32_MAX)
		take = UINT32_MAX;
	atomic_store_explicit(&c->tx->spin_take, (uint32_t)take, memory_order_seq_cst);
	changed = spin_for_change(atomic_load_explicit(&sh->nonblock, memory_order_relaxed),
	                          io_spin_peer_cpu(c), &c->rx->prod, sh->cons, &c->rx->flags);
	if (changed) {
		/* the bytes' line is on its way while the read makes ready */
		__builtin_prefetch(ring_data_ro(c->rx) + (sh->cons & (c->rx_size - 1)));
		/* no sleep follows: no promise to leave, only the offer to take
		 * back - seq_cst, before the look at the producer that follows
		 * (rx_recv_step, rx_peek): a writer that still saw the offer
		 * published before that look, and this read takes its bytes */
		atomic_store_explicit(&c->tx->spin_take, 0, memory_order_seq_cst);
		return LOOK_AGAIN;
	}
	if (futex) {
		*seq = atomic_load_explicit(&c->tx->wake_seq, memory_order_seq_cst);
		futex = atomic_compare_exchange_strong(&c->tx->futex_take, &none, (uint32_t)take);
	}
	if (!futex)
		atomic_fetch_add_explicit(&c->tx->sleepers, 1, memory_order_seq_cst);
	atomic_store_explicit(&c->tx->spin_take, 0, memory_order_seq_cst);
	/* a cursor that fails its checks is a reason to look again (and reset), not to sleep */
	if (changed || rx_peer_prod(c, &prod) < 0 || prod != sh->cons) {
		if (futex)
			atomic_store_explicit(&c->tx->futex_take, 0, memory_order_relaxed);
		else
			atomic_fetch_sub_explicit(&c->tx->sleepers, 1, memory_order_relaxed);
		return LOOK_AGAIN;
	}
	return futex ? SLEEP_FUTEX : SLEEP_PEEK;
}

/*
 * Wait for a doorbell or a hang-up (until @deadline, if not 0).  Returns 0
 * to look again, 1 at end of stream, or -errno (EAGAIN for non-blocking or
 * timeout, EINTR).
 */
/*
 * The kernel's wait on the doorbell socket, a peek of one byte; with a
 * @deadline (MSG_WAITALL under SO_RCVTIMEO, whose timeout bounds the whole
 * call, not each of its waits) only until then, EAGAIN after it.
 */
static ssize_t rx_socket_peek(int fd, int dontwait, long long deadline)
{
	char b;

	if (deadline && !dontwait) {
		long long left = deadline - mono_now_ms();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = left > 0 ? sys_poll(&p, 1, (int)left) : 0;

		if (r <= 0) {
			if (r == 0)
				errno = EAGAIN;
			return -1;
		}
		dontwait = 1;
	}
	return sys_recv(fd, &b, 1, MSG_PEEK | (dontwait ? MSG_DONTWAIT : 0));
}

static int rx_wait(struct conn *c, int fd, int dontwait, size_t take, long long deadline)
{
	struct conn_shared *sh = c->sh;
	int kind = SLEEP_PEEK;
	uint32_t seq = 0;
	ssize_t n;

	if (!dontwait && (kind = rx_spin(c, take, futex_ok(c, take), &seq)) == LOOK_AGAIN)
		return 0;
	shared_unlock(&sh->rx_lock);
	if (!dontwait)
		io_thread_sleeps();
	if (kind == SLEEP_FUTEX) {
		int r = bell_sleep(c, fd, seq);

		if (r == BELL_SLEEP_ON) {
			/* a long wait: go on as a sleeper on the doorbell socket */
			atomic_fetch_add_explicit(&c->tx->sleepers, 1, memory_order_seq_cst);
			atomic_store_explicit(&c->tx->futex_take, 0, memory_order_seq_cst);
			if (!rx_has_unread(c))
				goto socket_wait;
			atomic_fetch_sub_explicit(&c->tx->sleepers, 1, memory_order_relaxed);
			r = 0;
		}
		atomic_store_explicit(&c->tx->futex_take, 0, memory_order_relaxed);
		shared_lock(&sh->rx_lock);
		return r;
	}
socket_wait:
	/* the kernel's own wait: a signal handler with SA_RESTART restarts
	 * it, exactly as it would a TCP read (design.md §8) */
	n = rx_socket_peek(fd, dontwait, deadline);
	int err = errno;
	if (!dontwait)
		atomic_fetch_sub_explicit(&c->tx->sleepers, 1, memory_order_relaxed);
	shared_lock(&sh->rx_lock);
	if (n > 0) {
		if (move_flagged(c))
			return 0;       /* another thread made @fd the TCP socket: look again */
		close_mark_broken(c);
		return -ECONNRESET;
	}
	if (n < 0)
		return -err;
	/* a message is queued, or the peer hung up */
	if (atomic_load_explicit(&c->rx->bell_seq, memory_order_acquire) != sh->bells_drained)
		return 0;
	uint32_t hup = bell_hangup_flags(c, fd);
	if (hup) {
		atomic_fetch_or(&sh->flags, hup);
		return 1;
	}
	sched_yield();          /* a doorbell sent but not yet counted: brief */
	return 0;
}

static _Thread_local int interrupted;

void rx_note_interrupted(void)
{
	interrupted = 1;
}

/*
 * Woken IDLE_LOOK times with nothing to read.  rx_wait() believes a doorbell
 * count before a hang-up (a queued doorbell and the end of the socket both
 * read as 0 bytes), so a peer that counted doorbells it never sent and then
 * went away would keep us draining nothing for ever: look for the hang-up
 * here.  1: it hung up (the next look ends the stream); 0: look again;
 * -ECONNRESET once the doorbells have not matched for too long (hostile).
 */
#define IDLE_LOOK 64
/*
 * Consecutive wake-ups without a byte after which the doorbells are taken
 * for a hostile peer's: an honest writer rings only after it produced, so
 * one wake-up in a few may find nothing (a doorbell drained late), never
 * thousands in a row.  Bounds what such a peer costs a non-blocking read
 * (about 13 ms; 100 000 cost 320 ms).
 */
#define IDLE_LOOPS_MAX 4096

static int rx_idle_look(struct conn *c, int fd, int idle_loops)
{
	uint32_t hup = bell_hangup_flags(c, fd);

	if (hup) {
		atomic_fetch_or(&c->sh->flags, hup);
		return 1;
	}
	if (idle_loops > IDLE_LOOPS_MAX) {
		close_mark_broken(c);
		return -ECONNRESET;
	}
	return 0;
}

/*
 * The ring looks empty: publish our cursor, so that the writer rings for
 * what it writes next, and look once more.  1 if bytes came meanwhile;
 * else stale doorbells are drained and the caller may sleep.
 */
static int rx_empty_before_wait(struct conn *c, int fd)
{
	uint64_t prod;

	if (c->sh->cons_pub != c->sh->cons)
		publish_cons(c);
	if (rx_peer_prod(c, &prod) == 0 && prod != c->sh->cons)
		return 1;
	bell_drain(c, fd, 0);
	return 0;
}

/* A wait that brought nothing (@r 0): now and then a closer look. */
static int rx_after_idle_wait(struct conn *c, int fd, int r, int *idle_loops)
{
	if (r == 0 && ++*idle_loops % IDLE_LOOK == 0)
		r = rx_idle_look(c, fd, *idle_loops);
	return r;
}

/* A recv() under way (rx_recv): what it asked for and what it has. */
struct rx_call {
	const struct iovec *iov;
	int iovcnt;
	int peek, waitall, dontwait;
	size_t total, got;
	size_t target;          /* what it waits for: SO_RCVLOWAT's bytes, or all of them */
	uint64_t lowat;
	int waited;             /* it found the ring empty and waited: under SO_RCVLOWAT
	                           the kernel copies nothing until the mark is reached */
	long long deadline;     /* SO_RCVTIMEO's end for a MSG_WAITALL call (or one under
	                           SO_RCVLOWAT), or 0 */
};

#define RX_STOP (-1)    /* rx_recv_step: done, with what it got */

static int rx_wait_more(struct conn *c, int fd, uint64_t have_prod);

static int rx_past_deadline(const struct rx_call *k)
{
	return k->deadline && mono_now_ms() >= k->deadline;
}

/*
 * MSG_PEEK|MSG_WAITALL found fewer bytes than it asked for: the kernel
 * waits for all of them, then the peek copies from the front again.  An
 * end, a timeout or a signal first: what it found is the answer.
 */
static int rx_peek_all(struct conn *c, int fd, struct rx_call *k, uint64_t prod)
{
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);

	if (k->dontwait || interrupted || rx_end_state(c, pf) != 0 || rx_past_deadline(k))
		return RX_STOP;
	if (rx_wait_more(c, fd, prod) != 0)
		return RX_STOP;
	k->got = 0;
	return 0;
}

/* Copy what the peer produced up to @prod; RX_STOP, 0 to go on, or an errno. */
static int rx_recv_take(struct conn *c, int fd, struct rx_call *k, uint64_t prod)
{
	struct rx_at at;
	long n;

	/* a peek copies once (it never waits for all), from our position */
	rx_at_load(c->sh, &at);
	n = rx_take(c, k->iov, k->iovcnt, k->got, &at, prod, k->total - k->got, 1);
	if (n < 0)
		return ECONNRESET;
	k->got += (size_t)n;
	if (!k->peek)
		rx_took(c, fd, &at, prod, (size_t)n);
	if (k->got == k->total || (!k->waitall && k->got >= k->target))
		return RX_STOP;
	return k->peek ? rx_peek_all(c, fd, k, prod) : 0;
}

/*
 * SO_RCVLOWAT: a blocking read waits until the bytes it has not taken
 * reach the mark, as TCP wakes its reader only then (tcp_data_ready).  A
 * timeout, a signal or a hang-up ends the wait, and what is there is the
 * answer, as the kernel copies it then.  0: look again.
 */
static int rx_lowat_wait(struct conn *c, int fd, struct rx_call *k, uint64_t prod)
{
	if (!interrupted && !rx_past_deadline(k) && rx_wait_more(c, fd, prod) == 0)
		return 0;
	k->lowat = 1;
	k->target = 1;
	return 0;
}

/*
 * One look at the ring, and a wait if it is empty and the call may wait:
 * 0 to look again, RX_STOP, or the errno the call fails with if it got
 * nothing.
 */
static int rx_recv_step(struct conn *c, int fd, struct rx_call *k, int *idle_loops)
{
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);
	uint64_t prod;
	int end;

	if (rx_peer_prod(c, &prod) < 0)
		return ECONNRESET;
	/* after shutdown(SHUT_RD) Linux still hands out what arrives; an empty
	 * queue reads as the end (rx_end_state) */
	if (prod != c->sh->cons) {
		*idle_loops = 0;        /* bytes came: the doorbells matched */
		if ((k->got || k->waited) && prod - c->sh->cons < k->lowat && !rx_end_state(c, pf))
			return rx_lowat_wait(c, fd, k, prod);
		return rx_recv_take(c, fd, k, prod);
	}
	end = rx_end_read(c, pf);
	if (end < 0)
		return -end;
	if (end == RX_END_MOVED) {
		/* sealed now: a publish that landed before the seal is read first */
		if (rx_peer_prod(c, &prod) < 0)
			return ECONNRESET;
		if (prod != c->sh->cons)
			return rx_recv_take(c, fd, k, prod);
		if (!k->got)
			return EXDEV;   /* the caller reads the TCP socket */
	}
	if (end || (k->got >= k->target && !k->waitall))
		return RX_STOP;
	if (rx_past_deadline(k))
		return k->got ? RX_STOP : EAGAIN;
	if (rx_empty_before_wait(c, fd))
		return 0;
	k->waited = 1;
	end = interrupted && !k->dontwait ? -EINTR :
	      rx_wait(c, fd, k->dontwait, k->peek ? 0 : k->total - k->got, k->deadline);
	end = rx_after_idle_wait(c, fd, end, idle_loops);
	return end < 0 ? -end : 0;
}

ssize_t rx_recv(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	struct conn_shared *sh = c->sh;
	struct rx_call k = { .iov = iov, .iovcnt = iovcnt, .peek = (flags & MSG_PEEK) != 0 };
	int err, idle_loops = 0, timeo;

	k.waitall = (flags & MSG_WAITALL) != 0;
	k.dontwait = (flags & MSG_DONTWAIT) ||
	             atomic_load_explicit(&sh->nonblock, memory_order_relaxed);
	/* a peek or a read that may not wait takes what there is */
	k.lowat = k.dontwait || k.peek ? 1 : rx_lowat(c);
	if ((k.waitall || k.lowat > 1) && !k.dontwait && (timeo = io_rcvtimeo_ms(c, fd)) > 0)
		k.deadline = mono_now_ms() + timeo;
	if (flags & MSG_OOB)
		return -EINVAL;
	if (flags & MSG_ERRQUEUE)
		return -EAGAIN;         /* no timestamps, no zero-copy reports: empty */
	if (io_hold_mine(&c->rx_hold))
		return -EDEADLK;        /* a peek of this thread is not consumed */
	for (int i = 0; i < iovcnt; i++)
		k.total += iov[i].iov_len;
	if (k.total == 0)
		return 0;
	k.target = k.lowat < k.total ? (size_t)k.lowat : k.total;
	if (io_lock(&sh->rx_lock, &c->rx_hold, k.dontwait) < 0)
		return -EAGAIN;         /* another thread's peek */
	while ((err = rx_recv_step(c, fd, &k, &idle_loops)) == 0)
		;
	shared_unlock(&sh->rx_lock);
	interrupted = 0;
	if (k.got == 0 && err > 0) {
		if (err != EAGAIN && err != EXDEV)
			DBG("recv fd %d: %s", fd, strerror(err));
		return -err;
	}
	return (ssize_t)k.got;
}

/*
 * We are about to wait with bytes unread (a peek wanting more than is
 * there): a writer waiting for room must get what we consumed, or both
 * wait for ever - its next bytes are what we wait for.  Our cursor is
 * published first, then write_blocked looked at (both seq_cst, against
 * the writer's raise-then-look): either the writer sees the room, or we
 * see it blocked and drain its doorbells, which wakes it (io.h).
 */
static void rx_free_writer(struct conn *c, int fd)
{
	struct conn_shared *sh = c->sh;

	if (sh->cons_pub != sh->cons)
		publish_cons(c);
	if (atomic_load_explicit(&c->rx->write_blocked, memory_order_seq_cst) &&
	    sh->cons_woke != sh->cons) {
		bell_drain(c, fd, 1);
		sh->cons_woke = sh->cons;
	}
}

/*
 * A peek waiting for more than the @have bytes it found: their doorbell
 * stays queued (it covers unread bytes), so the doorbell socket cannot be
 * slept on.  Sleep on our futex word instead - every produce wakes it
 * (bell_wake_sleeper) - in ticks of bell_sleep(), looking for a hang-up
 * between them, so a writer that died is noticed within a tick.  Returns 0
 * to look again, 1 at a hang-up, or -errno.
 */
static int rx_wait_more(struct conn *c, int fd, uint64_t have_prod)
{
	struct conn_shared *sh = c->sh;
	uint32_t none = 0, seq;
	uint64_t prod;
	int r, mine;

	rx_free_writer(c, fd);

	/* the rest of what it waits for is usually on its way (a message
	 * being written): watch for it first, as a blocking read does before
	 * it sleeps (spin.h) - a sleep here costs the writer a wake-up call
	 * for every commit */
	if (spin_for_change(atomic_load_explicit(&sh->nonblock, memory_order_relaxed),
	                    io_spin_peer_cpu(c), &c->rx->prod, have_prod, &c->rx->flags))
		return 0;
	seq = atomic_load_explicit(&c->tx->wake_seq, memory_order_seq_cst);
	/* take 1: a writer still rings for any unread byte it adds */
	mine = atomic_compare_exchange_strong(&c->tx->futex_take, &none, 1);
	if (rx_peer_prod(c, &prod) < 0 || prod != have_prod) {
		if (mine)
			atomic_store_explicit(&c->tx->futex_take, 0, memory_order_relaxed);
		return 0;
	}
	shared_unlock(&sh->rx_lock);
	io_thread_sleeps();
	if (mine) {
		r = bell_sleep(c, fd, seq);
		atomic_store_explicit(&c->tx->futex_take, 0, memory_order_relaxed);
	} else {
		/* another thread of ours sleeps on the word: a short nap */
		struct timespec t = { .tv_nsec = 1000000 };
		r = nanosleep(&t, NULL) < 0 && !bell_signals_restart() ? -EINTR : 0;
	}
	shared_lock(&sh->rx_lock);
	if (r == BELL_SLEEP_ON || r == -EAGAIN) {
		uint32_t hup = bell_hangup_flags(c, fd);

		if (hup) {
			atomic_fetch_or(&sh->flags, hup);
			return 1;
		}
		r = 0;
	}
	return r;
}

/* The peeked bytes, where they lie; the receive lock stays held until rx_consume. */
static long rx_peek_hand_out(struct conn *c, const struct rx_run *run, uint64_t have,
                             struct iovec iov[2])
{
	if (run->pool) {
		iov[0] = (struct iovec){ (void *)run->pool, have };
		iov[1] = (struct iovec){ NULL, 0 };
	} else {
		ring_pieces((uint8_t *)ring_data_ro(c->rx), c->rx_size, c->sh->cons, have, iov);
	}
	io_hold_take(&c->rx_hold, have);
	return (long)have;
}

/*
 * A peek found fewer than @min bytes (@have of them, up to @prod) and may
 * wait: *@r is what the wait says (rx_wait's answers), within SO_RCVTIMEO's
 * @deadline.  1 when bytes came while it made ready: look again at once.
 */
static int rx_peek_wait(struct conn *c, int fd, uint64_t prod, uint64_t have, size_t min,
                        long long deadline, long *r)
{
	if (have) {
		/* SO_RCVTIMEO bounds the whole wait (the wait for a first byte,
		 * below, has the kernel's own timeout) */
		*r = deadline && mono_now_ms() >= deadline ? -EAGAIN : rx_wait_more(c, fd, prod);
		return 0;
	}
	/* empty: as a read does (rx_recv), make sure the writer rings */
	if (rx_empty_before_wait(c, fd))
		return 1;
	/* as a read of @min bytes waits: the consume that follows takes them
	 * (bytes it leaves have no doorbell; every later wait looks at the
	 * ring, as after such a read) */
	*r = rx_wait(c, fd, 0, min, 0);
	return 0;
}

long rx_peek(struct conn *c, int fd, size_t min, struct iovec iov[2], int dontwait)
{
	struct conn_shared *sh = c->sh;
	int idle_loops = 0, timeo;
	long long deadline = 0;
	long r;

	if (min > c->rx_size)
		return -EMSGSIZE;
	if (!min)
		min = 1;
	dontwait = dontwait || atomic_load_explicit(&sh->nonblock, memory_order_relaxed);
	if (io_lock(&sh->rx_lock, &c->rx_hold, dontwait) < 0)
		return -EAGAIN;         /* another thread's peek */
	if ((timeo = io_rcvtimeo_ms(c, fd)) > 0)
		deadline = mono_now_ms() + timeo;
	for (;;) {
		uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);
		uint64_t prod, have;
		struct rx_at at;
		struct rx_run run;
		int end, edge;

		rx_at_load(sh, &at);
		if (rx_peer_prod(c, &prod) < 0 || rx_run_at(c, &at, prod, &run, 1) < 0) {
			r = -ECONNRESET;
			break;
		}
		have = run.len;
		/* a run that ends at a reference's edge grows no more: it is all
		 * there is in one place */
		edge = have && (run.pool || at.cons + have != prod);
		end = have < min && !edge ? rx_end_read(c, pf) : 0;
		if (have >= min || edge || (end > 0 && have))
			return rx_peek_hand_out(c, &run, have, iov);
		if (end) {
			r = end < 0 ? end : end == RX_END_MOVED ? -EXDEV : 0;
			break;
		}
		if (dontwait) {
			if (have)
				rx_free_writer(c, fd);  /* before the program waits elsewhere */
			r = -EAGAIN;
			break;
		}
		if (rx_peek_wait(c, fd, prod, have, min, deadline, &r))
			continue;
		r = rx_after_idle_wait(c, fd, r, &idle_loops);
		if (r < 0)
			break;
		if (r > 0)
			idle_loops = 0;         /* a hang-up: the next look ends the stream */
	}
	shared_unlock(&sh->rx_lock);
	return r;
}

void rx_consume(struct conn *c, int fd, size_t n)
{
	struct conn_shared *sh = c->sh;

	io_hold_drop(&c->rx_hold);
	if (n) {
		struct rx_at at;
		long took;

		/* the run peeked is still there: the lock was held meanwhile */
		rx_at_load(sh, &at);
		took = rx_take(c, NULL, 0, 0, &at, sh->peer_prod_seen, n, 1);
		if (took > 0)
			rx_took(c, fd, &at, sh->peer_prod_seen, (size_t)took);
	}
	shared_unlock(&sh->rx_lock);
}

void rx_release(struct conn *c)
{
	io_hold_drop(&c->rx_hold);
	shared_unlock(&c->sh->rx_lock);
}

/* Unread bytes of the stream from @at, the producer at @prod. */
static uint32_t rx_unread(struct conn *c, struct rx_at *at, uint64_t prod, int judge)
{
	long n = rx_take(c, NULL, 0, 0, at, prod, UINT32_MAX, judge);

	return n > 0 ? (uint32_t)n : 0;
}

uint32_t rx_available(struct conn *c)
{
	struct conn_shared *sh = c->sh;
	struct rx_at at;
	uint64_t prod;
	uint32_t n = 0;

	if (atomic_load_explicit(&sh->flags, memory_order_relaxed) & SH_RESEND)
		return 0;       /* the rest comes again over TCP (move.c) */
	if (atomic_load_explicit(&c->rx_hold.thread, memory_order_relaxed)) {
		/* a peek keeps the receive lock, maybe for long (maybe this
		 * thread's): count without it - only the peek's consume moves
		 * our position meanwhile - and leave any verdict on the peer's
		 * references to the reader */
		prod = atomic_load_explicit(&c->rx->prod, memory_order_acquire);
		if (rx_at_snapshot(sh, &at) < 0 ||
		    !ring_prod_valid(at.cons, __atomic_load_n(&sh->peer_prod_seen, __ATOMIC_RELAXED),
		                     prod, c->rx_size))
			return 0;
		return rx_unread(c, &at, prod, 0);
	}
	shared_lock(&sh->rx_lock);
	if (rx_peer_prod(c, &prod) == 0) {
		rx_at_load(sh, &at);
		n = rx_unread(c, &at, prod, 1);
	}
	shared_unlock(&sh->rx_lock);
	return n;
}

int rx_settle_bells(struct conn *c, int fd)
{
	struct conn_shared *sh = c->sh;
	uint64_t prod;
	int idle = 0;
	char b;

	if (atomic_load_explicit(&c->rx_hold.thread, memory_order_relaxed))
		return 0;               /* a peek holds bytes (and the lock): readable */
	shared_lock(&sh->rx_lock);
	if (rx_peer_prod(c, &prod) == 0 && prod - sh->cons < rx_lowat(c) &&
	    rx_end_state(c, atomic_load_explicit(&c->rx->flags, memory_order_acquire)) == 0) {
		if (prod == sh->cons) {
			bell_drain(c, fd, 0);
		} else {
			/* too few: the writer rings at the mark, measured from the
			 * cursor it sees - ours, published now */
			publish_cons(c);
			bell_drain_live(c, fd, rx_lowat(c));
		}
		idle = sys_recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN;
	}
	shared_unlock(&sh->rx_lock);
	return idle;
}
