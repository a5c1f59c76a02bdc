/*
 * close.c - what ending a connection means for its rings: shutdown, the
 * last holder's close, abort (the descriptor side of closing - which
 * descriptor, which holder, the hidden TCP socket - is fdclose.c's).
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

void io_release_mine(struct conn *c)
{
	if (io_hold_mine(&c->tx_hold))
		tx_abort(c);
	if (io_hold_mine(&c->rx_hold))
		rx_release(c);
}

void conn_mark_broken(struct conn *c)
{
	atomic_fetch_or(&c->sh->flags, SH_BROKEN);
}

/* @abort: the peer hears a reset even if we read everything it sent. */
void conn_publish_close(struct conn *c, int abort)
{
	struct conn_shared *sh = c->sh;
	uint64_t prod;
	uint32_t flags = RING_F_CLOSED;

	if (abort || (atomic_load(&sh->flags) & SH_ABORT_AT_CLOSE))
		flags |= RING_F_ABORT;

	sh_lock(&sh->rx_lock);
	if (rx_peer_prod(c, &prod) < 0 || prod != sh->cons)
		flags |= RING_F_ABORT;
	sh_unlock(&sh->rx_lock);
	sh_lock(&sh->tx_lock);
	atomic_store(&c->tx->fin_prod, sh->prod);
	atomic_fetch_or_explicit(&c->tx->flags, flags, memory_order_release);
	sh_unlock(&sh->tx_lock);
	bell_wake_sleeper(c);
}

int conn_shutdown(struct conn *c, int fd, int how)
{
	struct conn_shared *sh = c->sh;

	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		errno = EINVAL;
		return -1;
	}
	if (how != SHUT_RD && io_hold_mine(&c->tx_hold))
		tx_abort(c);            /* shutting down writing takes the transmit lock */
	if (how != SHUT_WR) {
		atomic_fetch_or(&sh->flags, SH_SHUT_RD);
		bell_wake_word(&c->tx->wake_seq);       /* our own reader, if asleep */
	}
	if (how != SHUT_RD) {
		sh_lock(&sh->tx_lock);
		if (!(atomic_load(&sh->flags) & SH_SHUT_WR)) {
			atomic_store(&c->tx->fin_prod, sh->prod);
			atomic_fetch_or_explicit(&c->tx->flags, RING_F_SHUTDOWN, memory_order_release);
			atomic_fetch_or(&sh->flags, SH_SHUT_WR);
		}
		sh_unlock(&sh->tx_lock);
		bell_wake_sleeper(c);
		/* the peer's descriptor reports POLLRDHUP / EPOLLRDHUP */
		sys_shutdown(fd, SHUT_WR);
	}
	return 0;
}

int conn_leave_at_exec(struct conn *c)
{
	if (c->mode != MODE_SHM)
		return 0;
	if (atomic_fetch_sub(&c->sh->holders, 1) == 1) {
		conn_publish_close(c, 0);
		return 0;
	}
	return 1;
}
