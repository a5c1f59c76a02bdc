/*
 * close.c - shutdown, close, abort, and what an exec does to a connection.
 *
 * The kernel tells the peer that we are gone (the doorbell socket hangs up
 * when its last holder closes or dies).  What only we know is *how*: the last
 * holder publishes CLOSED, plus ABORT when unread data is thrown away (TCP
 * would send a reset), before closing the socket, so the peer reads every
 * byte we wrote and then EOF or ECONNRESET.
 */
#include "io.h"
#include "fdtab.h"

#include "deferred.h"
#include "inbox.h"
#include "payoff.h"
#include "region.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>

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
static void publish_close(struct conn *c, int abort)
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

static void close_hidden_tcp(struct conn *c, int last)
{
	if (c->tcp_fd < 0)
		return;
	if (last && !c->direct) {
		/* no TIME_WAIT for a socket that carried no data: its port is free at once */
		struct linger l = { .l_onoff = 1, .l_linger = 0 };
		sys_setsockopt(c->tcp_fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
		deferred_close(c->tcp_fd);
	} else {
		sys_close(c->tcp_fd);
	}
	c->tcp_fd = -1;
}

/*
 * A server's question: did the client hang up without publishing CLOSED?
 * Then it crashed, and its region is not worth keeping mapped for a next
 * connection (region_put).  One poll, only when we close first or the
 * client died.
 */
static int peer_crashed(struct conn *c, int fd)
{
	if (region_mine(c->region) ||
	    atomic_load_explicit(&c->rx->flags, memory_order_acquire) & RING_F_CLOSED)
		return 0;
	return (peer_hangup_flags(fd) & SH_PEER_GONE) != 0;
}

/* A client tells payoff.c how much this connection carried. */
static void record_payoff(struct conn *c)
{
	uint64_t bytes = 0;

	if (!region_mine(c->region))
		return;
	if (c->direct) {
		payoff_record_paid(&c->peer);   /* cheaper than TCP to set up, however short */
		return;
	}
	if (c->slot)
		bytes = atomic_load(&c->slot->tx_bytes) + atomic_load(&c->slot->rx_bytes);
	payoff_record(&c->peer, atomic_load_explicit(&c->calls, memory_order_relaxed), bytes);
}

/* The last descriptor of this process for @c (@fd) is going away. */
static void conn_leave_process(struct conn *c, int fd)
{
	int last = 1;

	if (c->mode == MODE_SHM) {
		last = atomic_fetch_sub(&c->sh->holders, 1) == 1;
		if (last) {
			publish_close(c, 0);
			record_payoff(c);
		}
		c->reusable = last && !peer_crashed(c, fd);
		close_hidden_tcp(c, last);
	}
	/* a forked child closing an inherited TCP descriptor leaves the listing to its parent */
	if (last && (c->mode == MODE_SHM || !c->inherited)) {
		stats_slot_release(totals, c->slot);
		c->slot = NULL;
	}
}

void conn_close_fd(int fd)
{
	struct conn *c = conn_unbind_fd(fd);

	if (!c)
		return;
	if (c->bell_fd >= 0) {
		/* still undecided, and the descriptor was closed behind our back
		 * (close_range): withdraw; a server that took it sees the pair hang up */
		offer_withdraw(c->tx);
		sys_close(c->bell_fd);
		c->bell_fd = -1;
		atomic_store(&c->pending, PENDING_NONE);
	}
	if (c->fd_count == 0) {
		io_release_mine(c);     /* a claim or peek of ours would lock us out */
		conn_leave_process(c, fd);
	}
	conn_put(c);
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
		publish_close(c, 0);
		return 0;
	}
	return 1;
}

void conn_reset_for_exec(int fd, int leave)
{
	/*
	 * Reads of a fresh, unconnected TCP socket fail with ENOTCONN and
	 * writes with EPIPE, as on a reset connection.  A vfork child shares
	 * our memory and the parent keeps the connection: there only the
	 * descriptor changes (@leave 0).
	 */
	int s = sys_socket(AF_INET, SOCK_STREAM, 0);
	int fl = sys_fcntl(fd, F_GETFD, 0);

	if (leave) {
		struct conn *c = conn_unbind_fd(fd);

		if (c && c->fd_count == 0 && c->mode == MODE_SHM &&
		    atomic_fetch_sub(&c->sh->holders, 1) == 1)
			publish_close(c, 1);
		if (c)
			conn_put(c);
	}
	if (s < 0)
		return;
	sys_dup3(s, fd, fl > 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	sys_close(s);
}
