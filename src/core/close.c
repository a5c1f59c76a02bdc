/*
 * close.c - what ending a connection means for its rings: shutdown, the
 * last holder's close, abort (the descriptor side of closing - which
 * descriptor, which holder, the hidden TCP socket - is handshake/release.c's).
 *
 * The kernel tells the peer that we are gone (the doorbell socket hangs up
 * when its last holder closes or dies).  What only we know is *how*: the last
 * holder publishes CLOSED, plus ABORT when unread data is thrown away (TCP
 * would send a reset), before closing the socket, so the peer reads every
 * byte we wrote and then EOF or ECONNRESET.
 */
#include "io.h"

#include "sys.h"

#include <errno.h>
#include <sys/socket.h>

void close_release_holds(struct conn *c)
{
	if (io_hold_mine(&c->tx_hold))
		tx_abort(c);
	if (io_hold_mine(&c->rx_hold))
		rx_release(c);
}

void close_mark_broken(struct conn *c)
{
	atomic_fetch_or(&c->sh->flags, SH_BROKEN);
}

/* @abort: the peer hears a reset even if we read everything it sent. */
void close_publish(struct conn *c, int abort)
{
	struct conn_shared *sh = c->sh;
	uint64_t prod;
	uint32_t flags = RING_F_CLOSED;

	if (abort || (atomic_load(&sh->flags) & (SH_ABORT_AT_CLOSE | SH_LINGER_ABORT)))
		flags |= RING_F_ABORT;

	shared_lock(&sh->rx_lock);
	if (rx_peer_prod(c, &prod) < 0 || prod != sh->cons)
		flags |= RING_F_ABORT;
	shared_unlock(&sh->rx_lock);
	shared_lock(&sh->tx_lock);
	atomic_store(&c->tx->fin_prod, sh->prod);
	atomic_fetch_or_explicit(&c->tx->flags, flags, memory_order_release);
	shared_unlock(&sh->tx_lock);
	bell_wake_sleeper(c);
}

int close_shutdown(struct conn *c, int fd, int how)
{
	struct conn_shared *sh = c->sh;

	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	if (how != SHUT_RD && io_hold_mine(&c->tx_hold))
		tx_abort(c);            /* shutting down writing takes the transmit lock */
	if (how != SHUT_WR) {
		atomic_fetch_or(&sh->flags, SH_SHUT_RD);
		bell_wake_word(&c->tx->wake_seq);       /* our own reader, if asleep */
		/* moved (before or after the flag: move_seal carries it too):
		 * what the ring holds is read, then the TCP socket, shut as well */
		if (move_seen(c) && c->tcp_fd >= 0)
			sys_shutdown(c->tcp_fd, SHUT_RD);
	}
	if (how != SHUT_RD) {
		if (move_seen(c))
			return -EXDEV;  /* the caller shuts the TCP socket down (move.c) */
		shared_lock(&sh->tx_lock);
		/* a writer that lost the race with a seal sent its bytes over
		 * TCP under this lock: the end goes after them, on TCP too */
		if (move_seen(c)) {
			shared_unlock(&sh->tx_lock);
			return -EXDEV;
		}
		if (!(atomic_load(&sh->flags) & SH_SHUT_WR)) {
			atomic_store(&c->tx->fin_prod, sh->prod);
			atomic_fetch_or_explicit(&c->tx->flags, RING_F_SHUTDOWN, memory_order_seq_cst);
			atomic_fetch_or(&sh->flags, SH_SHUT_WR);
		}
		shared_unlock(&sh->tx_lock);
		bell_wake_sleeper(c);
		/* the peer's descriptor reports POLLRDHUP / EPOLLRDHUP */
		sys_shutdown(fd, SHUT_WR);
		/* sealed meanwhile: the peer may read TCP by now, and hears it
		 * there as well (after its ring's end, the flag says the same;
		 * after what it asked to have again) */
		if (move_seen(c))
			move_shutdown_wr(c);
	}
	return 0;
}

int close_leave_at_exec(struct conn *c)
{
	if (c->mode != MODE_SHM)
		return 0;
	if (atomic_fetch_sub(&c->sh->holders, 1) == 1) {
		close_publish(c, 0);
		return 0;
	}
	return 1;
}
