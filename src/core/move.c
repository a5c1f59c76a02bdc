/*
 * move.c - a connection that goes on over its TCP socket: the rings are
 * sealed where they stand, what they hold is still read from them, and
 * every byte after that travels over TCP (docs/design.md §5b).
 *
 * Why: some things smclo should not carry itself - a process about to
 * install a seccomp filter that would kill it at the doorbell's send, say.
 * A connection made by the inbox or rendezvous handshake has an idle TCP
 * connection beneath it, so it can continue there with no byte lost or
 * repeated.
 *
 * How, without waiting for the peer: a producer cursor is *sealed* by
 * adding RING_PROD_MOVED (2^63) to it with a compare-and-swap.  Producers
 * publish with a compare-and-swap too, so a publish either lands before the
 * seal (its bytes are in the ring, read as usual) or fails after it (its
 * bytes go over TCP instead: tx.c).  Whoever sees RING_F_MOVED seals both
 * rings itself; sealing is idempotent, so neither side ever waits for the
 * other.  A reader takes what the ring holds up to the sealed cursor and
 * then reads TCP, which carries only bytes written after the seal.
 *
 * Sent again: a program that reads the TCP socket alone (a process that
 * cannot load smclo, which the connection is handed to: handshake/moved.c)
 * would miss what the ring still holds of the peer's stream.  Before
 * sealing, the side handing it on freezes its consumer cursor and asks the
 * peer (ring_hdr.resend); the peer, when it follows the move, sends those
 * bytes again over TCP from its own ring - before any byte of its own
 * after the seal, and before the FIN of a shutdown it published in the
 * ring - and says so (ring_hdr.resent).  The asker waits for that, bounded,
 * and resets what it hands on if it does not come.
 *
 * The shutdown of the doorbell socket (move_hang_up) wakes every waiter on
 * both sides - readers, writers, epoll and poll - with a hang-up that
 * bell_hangup_flags() no longer takes for the peer's end.  It is made by
 * whoever makes the descriptor the TCP socket (handshake/moved.c), just
 * before: once another thread has done that, the number names the TCP
 * socket, and a shutdown through it would end the very connection that
 * goes on there.
 */
#include "io.h"

#include "log.h"
#include "sys.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#define MOVE_RESEND_MS 1000     /* a peer that asked and then neither reads nor resets */

/* Seal the producer cursor at @word; @cons: the consumer's cursor, so a
 * cursor already sealed is seen as such.  Bounded: a writer that publishes
 * without pause makes each try fail, and each try gets it closer. */
static void move_seal_prod(_Atomic uint64_t *word, uint64_t cons, uint32_t size)
{
	uint64_t raw = atomic_load_explicit(word, memory_order_seq_cst);

	for (int tries = 0; tries < 4096; tries++) {
		if (ring_prod_sealed(raw, cons, size))
			return;
		if (atomic_compare_exchange_strong(word, &raw, raw + RING_PROD_MOVED))
			return;
	}
}

/* Did the peer ask us to send again what it had not read? */
static int move_asked(const struct conn *c)
{
	return (atomic_load_explicit(&c->rx->resend, memory_order_acquire) & RING_RESEND_SET) != 0;
}

/* Seal both rings; the first to do it on our side counts the move (@reason). */
static void move_seal(struct conn *c, int reason)
{
	struct conn_shared *sh = c->sh;

	uint32_t was = atomic_fetch_or(&sh->flags, SH_MOVED);

	if (!(was & SH_MOVED)) {
		if (totals)
			atomic_fetch_add(&totals->moved[reason], 1);
		if (c->slot)
			stats_slot_decide(NULL, c->slot, MODE_TCP, reason);
		/* a shutdown we published in the ring only: TCP says it too, so
		 * the peer's readiness on the TCP socket shows the end; and one
		 * of reading, so that a read of the empty socket ends, not waits */
		if ((was & SH_SHUT_WR) && c->tcp_fd >= 0 && !move_asked(c))
			sys_shutdown(c->tcp_fd, SHUT_WR);   /* else after sending again */
		if ((was & SH_SHUT_RD) && c->tcp_fd >= 0)
			sys_shutdown(c->tcp_fd, SHUT_RD);
	}
	atomic_fetch_or_explicit(&c->tx->flags, RING_F_MOVED, memory_order_seq_cst);
	move_seal_prod(&c->tx->prod, __atomic_load_n(&sh->peer_cons_seen, __ATOMIC_RELAXED),
	               c->tx_size);
	move_seal_prod((_Atomic uint64_t *)&c->rx->prod, __atomic_load_n(&sh->cons, __ATOMIC_RELAXED),
	               c->rx_size);
}

int move_possible(const struct conn *c)
{
	return c->mode == MODE_SHM && !c->direct && c->tcp_fd >= 0 &&
	       !atomic_load_explicit(&c->rx->no_tcp, memory_order_acquire);
}

int move_seen(struct conn *c)
{
	if (atomic_load_explicit(&c->sh->flags, memory_order_acquire) & SH_MOVED)
		return 1;
	if (!(atomic_load_explicit(&c->rx->flags, memory_order_acquire) & RING_F_MOVED))
		return 0;
	if (c->direct || c->tcp_fd < 0) {
		close_mark_broken(c);   /* no TCP beneath: a peer that says so lies */
		return 0;
	}
	move_seal(c, R_PEER_MOVED);
	return 1;
}

int move_start(struct conn *c, int reason)
{
	if (!move_possible(c))
		return -EOPNOTSUPP;
	move_seal(c, reason);
	bell_wake_word(&c->tx->wake_seq);
	bell_wake_word((_Atomic uint32_t *)&c->rx->wake_seq);
	return 0;
}

void move_hang_up(int bell_fd)
{
	char b;

	/* a writer of the peer's blocked on its doorbells gets room (a
	 * zero-length read takes one doorbell), then everyone on both sides
	 * wakes to the hang-up and finds the seal */
	for (int i = 0; i < 256 && sys_recv(bell_fd, &b, 0, MSG_DONTWAIT) == 0; i++)
		;
	sys_shutdown(bell_fd, SHUT_RDWR);
}

/* ---- sent again --------------------------------------------------------- */

int move_ask_resend(struct conn *c)
{
	struct conn_shared *sh = c->sh;

	/* a reference stands in the ring for bytes of the peer's pool: only
	 * the ring's own bytes can be sent again */
	if (atomic_load_explicit(&c->rx->ref_prod, memory_order_acquire) != sh->ref_cons ||
	    sh->ref_skip)
		return -1;
	atomic_fetch_or(&sh->flags, SH_RESEND);
	atomic_store_explicit(&c->tx->resend, sh->cons | RING_RESEND_SET, memory_order_seq_cst);
	return 0;
}

int move_resent(struct conn *c, uint32_t *word)
{
	*word = atomic_load_explicit(&c->rx->resent, memory_order_acquire);
	if (*word == RESENT_DONE)
		return 1;
	/* it could not; or closed before it followed: its TCP socket went
	 * with a reset */
	if (*word == RESENT_FAILED ||
	    (atomic_load_explicit(&c->rx->flags, memory_order_acquire) & (RING_F_CLOSED | RING_F_ABORT)))
		return -1;
	return 0;
}

/* Is a reference of ours placed in [@from, @to)?  (Its bytes are not in the ring.) */
static int move_refs_between(struct conn *c, uint64_t from, uint64_t to)
{
	uint64_t n = c->sh->ref_prod < RING_REFS ? c->sh->ref_prod : RING_REFS;

	for (uint64_t i = c->sh->ref_prod - n; i < c->sh->ref_prod; i++)
		if (atomic_load_explicit(&c->tx->ref[i % RING_REFS].pos, memory_order_relaxed) - from <
		    to - from)
			return 1;
	return 0;
}

/* Send [resend_next, @to) of our ring over TCP, waiting until @deadline. */
static int move_send_again(struct conn *c, uint64_t to, long deadline)
{
	struct conn_shared *sh = c->sh;

	while (sh->resend_next != to) {
		struct iovec iov[2];
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };
		struct pollfd p = { .fd = c->tcp_fd, .events = POLLOUT };
		long left = deadline - mono_now_ms();
		ssize_t k;

		ring_pieces(ring_data(c->tx), c->tx_size, sh->resend_next,
		            (uint32_t)(to - sh->resend_next), iov);
		k = sys_sendmsg(c->tcp_fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0)
			sh->resend_next += (uint64_t)k;
		else if (k < 0 && errno == EAGAIN && left > 0)
			sys_poll(&p, 1, (int)left);
		else if (k < 0 && errno != EINTR)
			return -1;      /* the asker gave up (reset), or its wait is over */
	}
	return 0;
}

/*
 * What cannot be sent again whole leaves a hole: the TCP connection is
 * reset - a connect() to AF_UNSPEC sends the peer a reset and leaves
 * ECONNRESET pending here, as a reset from the peer would - and the peer
 * is told, so that it stops waiting.
 */
static int move_resend_failed(struct conn *c)
{
	struct sockaddr sa = { .sa_family = AF_UNSPEC };

	atomic_fetch_or(&c->sh->flags, SH_RESEND_FAILED);
	if (c->tcp_fd >= 0 && sys_connect(c->tcp_fd, &sa, sizeof(sa)) < 0)
		DBG("sent again: no reset of our TCP socket (%d): the asker's resets it", errno);
	atomic_store_explicit(&c->tx->resent, RESENT_FAILED, memory_order_release);
	sys_futex_wake(&c->tx->resent);
	return -1;
}

int move_resend(struct conn *c)
{
	struct conn_shared *sh = c->sh;
	uint64_t ask = atomic_load_explicit(&c->rx->resend, memory_order_seq_cst);
	uint32_t f = atomic_load(&sh->flags);

	if (!(f & SH_MOVED) || (f & SH_RESENT))
		return 0;
	if (!(ask & RING_RESEND_SET)) {
		/* our bytes may go over TCP from here on: an ask that comes
		 * later (the peer asked as we moved ourselves) can only fail */
		atomic_fetch_or(&sh->flags, SH_UNASKED);
		return 0;
	}
	if (f & SH_RESEND_FAILED)
		return -1;
	ask &= ~RING_RESEND_SET;
	if (!(f & SH_RESENDING)) {
		/* the peer's word: within what we published, bytes of the ring
		 * only, and nothing of ours on TCP before them */
		uint32_t cur = atomic_load(&sh->flags);

		if (sh->prod - ask > c->tx_size || c->tcp_fd < 0 ||
		    move_refs_between(c, ask, sh->prod))
			return move_resend_failed(c);
		sh->resend_next = ask;
		/* not once a thread of ours may have put bytes on TCP unasked
		 * (move_resend_locked marks that without this lock) */
		do {
			if (cur & SH_UNASKED)
				return move_resend_failed(c);
		} while (!atomic_compare_exchange_weak(&sh->flags, &cur, cur | SH_RESENDING));
	}
	if (move_send_again(c, sh->prod, mono_now_ms() + MOVE_RESEND_MS) < 0)
		return move_resend_failed(c);
	atomic_fetch_or(&sh->flags, SH_RESENT);
	atomic_store_explicit(&c->tx->resent, RESENT_DONE, memory_order_release);
	sys_futex_wake(&c->tx->resent);        /* the asker waits on the word */
	/* a shutdown published in the ring before the move: its FIN after them */
	if (f & SH_SHUT_WR)
		sys_shutdown(c->tcp_fd, SHUT_WR);
	return 0;
}

int move_resend_asked(struct conn *c)
{
	int r;

	if (!move_asked(c) || (atomic_load(&c->sh->flags) & SH_RESENT))
		return 0;
	/* a thread holding a claim of the native API holds the lock, and may
	 * be the caller */
	if (io_hold_mine(&c->tx_hold))
		return move_resend(c);
	shared_lock(&c->sh->tx_lock);
	r = move_resend(c);
	shared_unlock(&c->sh->tx_lock);
	return r;
}

int move_resend_locked(struct conn *c)
{
	uint32_t was;

	if (!move_seen(c))
		return 0;
	if (move_asked(c))
		return move_resend_asked(c);
	/* nothing asked: our bytes may go on TCP from here.  Marked without
	 * the lock; a re-send another thread began meanwhile (an ask we did
	 * not see yet) is waited for under it, and one not begun can no
	 * longer begin (move_resend) */
	was = atomic_fetch_or(&c->sh->flags, SH_UNASKED);
	if ((was & SH_RESENT) || !(was & SH_RESENDING))
		return 0;
	return move_resend_asked(c);
}

void move_shutdown_wr(struct conn *c)
{
	/* after what the peer asked to have again: move_resend shuts down */
	if (move_resend_locked(c) == 0 && !move_asked(c))
		sys_shutdown(c->tcp_fd, SHUT_WR);
}
