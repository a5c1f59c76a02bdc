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
 * The shutdown of the doorbell socket (move_hang_up) wakes every waiter on
 * both sides - readers, writers, epoll and poll - with a hang-up that
 * bell_hangup_flags() no longer takes for the peer's end.  It is made by
 * whoever makes the descriptor the TCP socket (handshake/moved.c), just
 * before: once another thread has done that, the number names the TCP
 * socket, and a shutdown through it would end the very connection that
 * goes on there.
 */
#include "io.h"

#include "sys.h"

#include <errno.h>
#include <sys/socket.h>

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
		if ((was & SH_SHUT_WR) && c->tcp_fd >= 0)
			sys_shutdown(c->tcp_fd, SHUT_WR);
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
