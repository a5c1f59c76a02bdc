/*
 * release.c - a process lets go of a connection: a descriptor of it closed
 * (which one goes, whether it was this process's last one, the hidden TCP
 * socket, what payoff.c learns, an undecided offer withdrawn), and what an
 * exec does to a connection the new program cannot take.  What closing
 * means for the rings is core/close.c's.  Here, not in the descriptor
 * layer below, because leaving is the handshake's business too: the offer,
 * the payoff, the TCP socket's close put off.
 */
#include "hs_internal.h"

#include "io.h"

#include "deferred.h"
#include "inbox.h"
#include "payoff.h"
#include "region.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>

static void release_hidden_tcp(struct conn *c, int last)
{
	if (c->tcp_fd < 0)
		return;
	/* a move the peer made while we published our close: the close is
	 * TCP's too, an orderly one (core/move.c) */
	if (last && !c->direct && !move_seen(c)) {
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
static int release_peer_crashed(struct conn *c, int fd)
{
	if (region_mine(c->region) ||
	    atomic_load_explicit(&c->rx->flags, memory_order_acquire) & RING_F_CLOSED)
		return 0;
	return (bell_hangup_flags(c, fd) & SH_PEER_GONE) != 0;
}

/* A client tells payoff.c how much this connection carried. */
static void release_record_payoff(struct conn *c)
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
	payoff_record(&c->peer, atomic_load_explicit(&c->messages, memory_order_relaxed), bytes);
}

/* The last descriptor of this process for @c (@fd) is going away. */
static void release_last_holder(struct conn *c, int fd)
{
	int last = 1;

	if (c->tcp_fd >= 0 &&
	    (atomic_load(&c->moved_here) || (c->mode == MODE_SHM && move_seen(c)))) {
		/* moved to TCP (moved.c), followed or not: the close is TCP's
		 * (a FIN once every copy is gone, a reset for unread bytes as
		 * the kernel decides), and the rings' close protocol is over -
		 * after what the peer asked to have again (core/move.c) */
		move_resend_locked(c);
		sys_close(c->tcp_fd);
		c->tcp_fd = -1;
		c->mode = MODE_TCP;
	}
	if (c->mode == MODE_SHM) {
		last = atomic_fetch_sub(&c->sh->holders, 1) == 1;
		if (last) {
			close_publish(c, 0);
			release_record_payoff(c);
		}
		c->reusable = last && !release_peer_crashed(c, fd);
		release_hidden_tcp(c, last);
	}
	/* a forked child closing an inherited TCP descriptor leaves the listing to its parent */
	if (last && (c->mode == MODE_SHM || !c->inherited)) {
		stats_slot_release(totals, c->slot);
		c->slot = NULL;
	}
}

void hs_release_fd(int fd)
{
	struct conn *c = fd_unbind_conn(fd);

	if (!c)
		return;
	if (c->bell_fd >= 0) {
		/* still undecided, and the descriptor was closed behind our back
		 * (close_range): withdraw; a server that took it sees the pair hang up */
		inbox_offer_withdraw(c->tx);
		sys_close(c->bell_fd);
		c->bell_fd = -1;
		atomic_store(&c->pending, PENDING_NONE);
	}
	if (c->fd_count == 0) {
		close_release_holds(c);     /* a claim or peek of ours would lock us out */
		release_last_holder(c, fd);
	}
	/* under a seccomp filter (moved.c) the memory stays mapped: munmap()
	 * is no call of the program's, and the process ends with it */
	if (hs_sandboxed() && atomic_load(&c->moved_here))
		return;
	conn_put(c);
}

void hs_release_for_exec(int fd, int leave)
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
		struct conn *c = fd_unbind_conn(fd);

		if (c && c->fd_count == 0 && c->mode == MODE_SHM &&
		    atomic_fetch_sub(&c->sh->holders, 1) == 1) {
			close_publish(c, 1);
			/* moved (its last bytes came just before the seal,
			 * hs_hand_on_tcp): the peer reads TCP now, whose close
			 * at the exec must reset, as the ring's does */
			if (move_seen(c) && c->tcp_fd >= 0)
				sys_setsockopt(c->tcp_fd, SOL_SOCKET, SO_LINGER,
				               &(struct linger){ .l_onoff = 1, .l_linger = 0 },
				               sizeof(struct linger));
		}
		if (c)
			conn_put(c);
	}
	if (s < 0)
		return;
	sys_dup3(s, fd, fl > 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	sys_close(s);
}
