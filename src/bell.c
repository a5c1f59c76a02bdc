/*
 * bell.c - doorbells: when to ring, how to make a full writer unwritable, and
 * which doorbells a reader may consume (protocol summary in io.h).
 */
#include "io.h"

#include "sys.h"

#include <errno.h>
#include <poll.h>

int bell_send(struct conn *c, int fd, int dontwait)
{
	struct conn_shared *sh = c->sh;
	uint64_t seq = sh->bell_seq;

	/* log first, count after the send: the reader only trusts counted bells */
	atomic_store_explicit(&c->tx->bell_val[seq % BELL_LOG], sh->prod, memory_order_relaxed);
	if (sys_send(fd, NULL, 0, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0)) < 0) {
		if (errno == EPIPE || errno == ECONNRESET)
			atomic_fetch_or(&sh->flags, SH_PEER_GONE);
		return -errno;
	}
	sh->bell_seq = seq + 1;
	sh->bell_last_val = sh->prod;
	atomic_store_explicit(&c->tx->bell_seq, seq + 1, memory_order_release);
	return 0;
}

static uint64_t bells_outstanding(struct conn *c)
{
	return c->sh->bell_seq - atomic_load_explicit(&c->rx->bells_drained, memory_order_relaxed);
}

void bell_after_produce(struct conn *c, int fd)
{
	struct conn_shared *sh = c->sh;
	uint64_t peer_cons;

	if (bells_outstanding(c) >= BELL_LOG - 1)
		return;                 /* the reader has plenty queued already */
	/* pairs with the reader's publish-cons-then-load-prod (Dekker) */
	atomic_thread_fence(memory_order_seq_cst);
	peer_cons = atomic_load_explicit(&c->rx->cons, memory_order_seq_cst);
	if (sh->bell_seq != 0 && sh->bell_last_val > peer_cons)
		return;                 /* our last doorbell is still live */
	bell_send(c, fd, 1);
}

void bell_fill(struct conn *c, int fd)
{
	/* stops at EAGAIN (socket buffer full: descriptor unwritable) or at the log size */
	while (bells_outstanding(c) < BELL_LOG - 1 && bell_send(c, fd, 1) == 0)
		;
}

void bell_drain(struct conn *c, int fd, int keep_one)
{
	struct conn_shared *sh = c->sh;

	for (;;) {
		uint64_t i = sh->bells_drained;
		uint64_t seq = atomic_load_explicit(&c->rx->bell_seq, memory_order_acquire);
		uint64_t val;
		char b;
		ssize_t n;

		if (seq - i == 0 || seq - i > (1ull << 62))
			break;                          /* none counted (or nonsense) */
		if (keep_one && seq - i == 1)
			break;                          /* the last one keeps us readable */
		/* an entry older than the log was overwritten: its data is older still */
		val = seq - i > BELL_LOG ? 0 :
		      atomic_load_explicit(&c->rx->bell_val[i % BELL_LOG], memory_order_relaxed);
		if (!keep_one && val > sh->cons)
			break;                          /* live: covers unread data */
		n = sys_recv(fd, &b, 1, MSG_DONTWAIT);
		if (n != 0) {
			if (n > 0)
				conn_mark_broken(c);    /* bytes where only doorbells belong */
			break;
		}
		sh->bells_drained = i + 1;
		atomic_store_explicit(&c->tx->bells_drained, i + 1, memory_order_relaxed);
	}
}

int peer_hung_up(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };

	return sys_poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}
