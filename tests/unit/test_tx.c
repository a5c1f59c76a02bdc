/*
 * test_tx.c - transmit as claim/commit (tx.c) and its doorbell rule
 * (bell.c), one behaviour each: a claim is all the free space, in two
 * pieces where the ring wraps; a commit publishes what it says and an abort
 * nothing; a kept claim publishes message by message; a full ring is
 * "would block" for a claim that may not wait; a claim larger than the ring
 * is EMSGSIZE; a commit rings a doorbell that stands for the producer
 * cursor, only when the last one is no longer live and never for a reader
 * that promised to take it all; and a peer's consumer cursor beyond what
 * was sent resets the connection.
 */
#include "check.h"

#include "world.h"

#include <errno.h>

/* Doorbells waiting on the peer's end of the doorbell socket. */
static int bells_queued(struct world *w)
{
	int n = 0;
	char b;

	while (recv(w->other, &b, 1, MSG_DONTWAIT) == 0)
		n++;
	return n;
}

/* The peer reads everything we sent (and says so). */
static void peer_reads_all(struct world *w)
{
	atomic_store(&w->peer->cons, w->sh.prod);
}

static void test_claim_is_all_free_space(void)
{
	struct world *w = world();
	struct iovec iov[2];

	CHECK(tx_claim(&w->c, w->fd, 10, iov, 1) == RING);
	CHECK(iov[0].iov_base == ring_data(w->mine) && iov[0].iov_len == RING && iov[1].iov_len == 0);
	tx_abort(&w->c);
	CHECK(atomic_load(&w->mine->prod) == 0 && bells_queued(w) == 0);
	done(w);
}

static void test_claim_wraps_in_two_pieces(void)
{
	struct world *w = world();
	struct iovec iov[2];

	CHECK(tx_claim(&w->c, w->fd, RING - 100, iov, 1) == RING);
	tx_commit(&w->c, w->fd, RING - 100);
	peer_reads_all(w);
	CHECK(tx_claim(&w->c, w->fd, 200, iov, 1) == RING);
	CHECK(iov[0].iov_base == ring_data(w->mine) + RING - 100 && iov[0].iov_len == 100);
	CHECK(iov[1].iov_base == ring_data(w->mine) && iov[1].iov_len == RING - 100);
	memcpy(iov[0].iov_base, "x", 1);
	tx_commit(&w->c, w->fd, 150);
	CHECK(atomic_load(&w->mine->prod) == RING + 50);
	done(w);
}

static void test_commit_and_abort(void)
{
	struct world *w = world();
	struct iovec iov[2];

	CHECK(tx_claim(&w->c, w->fd, 1, iov, 1) > 0);
	memcpy(iov[0].iov_base, "hello", 5);
	tx_commit(&w->c, w->fd, 5);
	CHECK(atomic_load(&w->mine->prod) == 5 && !memcmp(ring_data(w->mine), "hello", 5));
	CHECK(tx_claim(&w->c, w->fd, 1, iov, 1) > 0);
	tx_abort(&w->c);
	CHECK(atomic_load(&w->mine->prod) == 5);
	/* the lock came back: another claim may go on */
	CHECK(tx_claim(&w->c, w->fd, 1, iov, 1) > 0);
	tx_abort(&w->c);
	done(w);
}

static void test_kept_claim_publishes_each_message(void)
{
	struct world *w = world();
	struct iovec iov[2];
	long n = tx_claim(&w->c, w->fd, 1, iov, 1);

	CHECK(n == RING);
	for (int i = 0; i < 10; i++) {
		tx_commit_keep(&w->c, w->fd, 100);
		CHECK(atomic_load(&w->mine->prod) == (uint64_t)(i + 1) * 100);
	}
	CHECK(w->c.tx_hold.len == RING - 1000);
	tx_commit(&w->c, w->fd, 0);     /* the end of the kept claim */
	CHECK(atomic_load(&w->mine->prod) == 1000);
	done(w);
}

static void test_full_ring_and_oversized_claim(void)
{
	struct world *w = world();
	struct iovec iov[2];

	CHECK(tx_claim(&w->c, w->fd, RING + 1, iov, 1) == -EMSGSIZE);
	CHECK(tx_claim(&w->c, w->fd, RING, iov, 1) == RING);
	tx_commit(&w->c, w->fd, RING);
	/* nobody reads: a claim that may not wait would block */
	CHECK(tx_claim(&w->c, w->fd, 1, iov, 1) == 0);
	peer_reads_all(w);
	CHECK(tx_claim(&w->c, w->fd, 1, iov, 1) == RING);
	tx_abort(&w->c);
	done(w);
}

static void test_doorbell_rule(void)
{
	struct world *w = world();
	struct iovec iov[2];

	/* the first commit rings, standing for the producer cursor */
	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	CHECK(bells_queued(w) == 1);
	CHECK(atomic_load(&w->mine->bell_seq) == 1 && atomic_load(&w->mine->bell_val[0]) == 10);
	/* unread still covered by it: no second doorbell */
	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	CHECK(bells_queued(w) == 0 && atomic_load(&w->mine->bell_seq) == 1);
	/* the peer read past it: the next commit rings again */
	peer_reads_all(w);
	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	CHECK(bells_queued(w) == 1 && atomic_load(&w->mine->bell_seq) == 2);
	/* a reader spinning in a read that takes it all: no doorbell */
	peer_reads_all(w);
	atomic_store(&w->peer->spin_take, 100);
	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	CHECK(bells_queued(w) == 0 && atomic_load(&w->mine->bell_seq) == 2);
	/* ... but one that takes less than is unread gets its doorbell */
	atomic_store(&w->peer->spin_take, 5);
	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	CHECK(bells_queued(w) == 1 && atomic_load(&w->mine->bell_seq) == 3);
	/* the cursor the writer saw last is behind the reader's (it had room,
	 * it did not look): a promise that covers what is unread now, not all
	 * it wrote since that cursor, is judged on the cursor fetched, which
	 * is kept */
	peer_reads_all(w);
	CHECK(w->sh.peer_cons_seen < w->sh.prod);
	atomic_store(&w->peer->spin_take, 10);
	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	CHECK(bells_queued(w) == 0 && atomic_load(&w->mine->bell_seq) == 3);
	CHECK(w->sh.peer_cons_seen == w->sh.prod - 10);
	done(w);
}

static void test_impossible_consumer_cursor_resets(void)
{
	struct world *w = world();
	struct iovec iov[2];

	tx_claim(&w->c, w->fd, 1, iov, 1);
	tx_commit(&w->c, w->fd, 10);
	atomic_store(&w->peer->cons, 11);       /* more than we ever sent */
	/* the cursor is read when the one seen last leaves too little room:
	 * a claim of the whole ring needs it */
	CHECK(tx_claim(&w->c, w->fd, 1, iov, 1) == (long)w->c.tx_size - 10);
	tx_abort(&w->c);
	CHECK(tx_claim(&w->c, w->fd, w->c.tx_size, iov, 1) == -ECONNRESET);
	done(w);
}

int main(void)
{
	test_claim_is_all_free_space();
	test_claim_wraps_in_two_pieces();
	test_commit_and_abort();
	test_kept_claim_publishes_each_message();
	test_full_ring_and_oversized_claim();
	test_doorbell_rule();
	test_impossible_consumer_cursor_resets();
	return check_report("test_tx");
}
