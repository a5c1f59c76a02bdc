/*
 * tcpend.c - the end of a connection as a TCP socket would report it.
 *
 * close.c publishes how an end happened (CLOSED, ABORT); the doorbell socket
 * hangs up.  What a program sees of that must be the kernel's TCP, which a
 * differential suite checks case by case (tests/py/test_differential.py):
 *
 *   - A reset leaves one error pending, as the kernel's sk_err: the first
 *     recv() (once the bytes that arrived before it are read), send() or
 *     SO_ERROR takes it; later reads see the end of the stream, later writes
 *     EPIPE.  poll() says POLLERR while it is pending.
 *   - Resets: the peer aborted (SO_LINGER {1, 0}, or closed with bytes it
 *     never read), broke the protocol, or died (killed) with bytes of ours
 *     it never read - its kernel would have answered them with a reset.  A
 *     peer that died having read everything ended as a close does.
 *   - A write to a peer that closed is taken, as TCP takes it (it cannot
 *     know yet); the peer's kernel answers with a reset, which in that state
 *     leaves EPIPE pending: the next write fails and raises SIGPIPE.
 *   - poll(): POLLRDHUP once the peer's end arrived, POLLHUP only when both
 *     directions are shut (or after a reset) - a closed peer alone is not a
 *     hang-up, though its doorbell socket reports one.
 *
 * The state is the connection's (conn_shared.reset): every descriptor and
 * every process that holds it sees one pending error, as they would share
 * one socket.  One word: END_RESET once reset, plus the errno still pending.
 */
#include "io.h"

#include <errno.h>
#include <poll.h>

#define END_RESET 0x10000u
#define END_ERRNO 0xffffu

static int tcpend_latch(struct conn *c, int err)
{
	uint32_t none = 0;

	return atomic_compare_exchange_strong(&c->sh->reset, &none, END_RESET | (uint32_t)err);
}

/* The peer died without saying how it closed (no CLOSED published). */
static int tcpend_peer_died(const struct conn *c, uint32_t f, uint32_t pf)
{
	return (f & SH_PEER_GONE) && !(pf & RING_F_CLOSED) && !move_flagged(c);
}

int tcpend_reset(struct conn *c)
{
	uint32_t f, pf;

	if (atomic_load_explicit(&c->sh->reset, memory_order_acquire))
		return 1;
	f = atomic_load(&c->sh->flags);
	pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);
	if ((f & SH_BROKEN) || (pf & RING_F_ABORT))
		tcpend_latch(c, ECONNRESET);
	else if (tcpend_peer_died(c, f, pf) &&
	         atomic_load_explicit(&c->rx->cons, memory_order_acquire) != c->sh->prod)
		tcpend_latch(c, ECONNRESET);
	return atomic_load_explicit(&c->sh->reset, memory_order_acquire) != 0;
}

int tcpend_take_error(struct conn *c)
{
	uint32_t v;

	if (!tcpend_reset(c))
		return 0;
	v = atomic_load(&c->sh->reset);
	while ((v & END_ERRNO) && !atomic_compare_exchange_weak(&c->sh->reset, &v, END_RESET))
		;
	return (int)(v & END_ERRNO);
}

int tcpend_read_error(struct conn *c)
{
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);

	/* the peer's FIN came before the reset (it shut down writing first, or
	 * the reset answered our write to a peer that had closed): a read
	 * sees the end, and the error waits for a write or SO_ERROR, as
	 * tcp_recvmsg looks at SOCK_DONE before sk_err */
	if ((pf & RING_F_SHUTDOWN) ||
	    (atomic_load(&c->sh->reset) & END_ERRNO) == EPIPE)
		return 0;
	return tcpend_take_error(c);
}

int tcpend_write_error(struct conn *c)
{
	uint32_t v;

	if (!tcpend_reset(c))
		return 0;
	v = atomic_load(&c->sh->reset) & END_ERRNO;
	return v ? (int)v : EPIPE;
}

void tcpend_reported(struct conn *c, int err)
{
	uint32_t v = END_RESET | (uint32_t)err;

	if (err > 0 && err <= (int)END_ERRNO)
		atomic_compare_exchange_strong(&c->sh->reset, &v, END_RESET);
}

int tcpend_peer_closed(const struct conn *c)
{
	uint32_t f = atomic_load(&c->sh->flags);
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);

	return (pf & RING_F_CLOSED) || tcpend_peer_died(c, f, pf);
}

int tcpend_discard_write(struct conn *c)
{
	if (atomic_load(&c->sh->flags) & SH_SHUT_WR || !tcpend_peer_closed(c) || tcpend_reset(c))
		return 0;
	return tcpend_latch(c, EPIPE);
}

uint32_t tcpend_hangup_flags(const struct conn *c, short revents)
{
	/* a move shuts the doorbell socket down to wake everyone: that
	 * hang-up is not the peer's end (move.c) */
	if (move_flagged(c))
		return 0;
	/* a half-close ends only what we read; a hang-up ends both directions -
	 * but a socket whose two ends both shut down writing hangs up too,
	 * with the peer alive and maybe still reading what we sent (pool
	 * buffers it has not released): not gone, unless it said it closed */
	if ((revents & (POLLHUP | POLLERR)) &&
	    ((atomic_load(&c->sh->flags) & SH_SHUT_WR) == 0 ||
	     (atomic_load_explicit(&c->rx->flags, memory_order_acquire) &
	      (RING_F_SHUTDOWN | RING_F_CLOSED | RING_F_ABORT)) != RING_F_SHUTDOWN))
		return SH_PEER_GONE | SH_PEER_SHUT;
	return (revents & (POLLRDHUP | POLLHUP)) ? SH_PEER_SHUT : 0;
}

#define END_BITS (POLLHUP | POLLERR | POLLRDHUP)

short tcpend_poll_events(struct conn *c, short revents, short events)
{
	uint32_t hup = tcpend_hangup_flags(c, revents);
	uint32_t f, pf;
	int reset, rcv_shut, snd_shut;
	short mask;

	if (hup)
		atomic_fetch_or(&c->sh->flags, hup);
	f = atomic_load(&c->sh->flags);
	pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);
	if (!(revents & END_BITS) && !(f & (SH_SHUT_RD | SH_SHUT_WR | SH_BROKEN | SH_PEER_SHUT)) &&
	    !(pf & (RING_F_SHUTDOWN | RING_F_CLOSED | RING_F_ABORT)))
		return revents;         /* the stream is not ending: as the kernel said */
	if (move_flagged(c))
		return revents;
	reset = tcpend_reset(c);
	rcv_shut = reset || (f & (SH_SHUT_RD | SH_PEER_SHUT)) ||
	           (pf & (RING_F_SHUTDOWN | RING_F_CLOSED));
	snd_shut = reset || (f & SH_SHUT_WR);
	mask = (short)(revents & ~END_BITS);
	if (rcv_shut)
		mask |= POLLIN | POLLRDNORM | POLLRDHUP;
	if (snd_shut)
		mask |= POLLOUT | POLLWRNORM;
	if (rcv_shut && snd_shut)
		mask |= POLLHUP;
	if (atomic_load(&c->sh->reset) & END_ERRNO)
		mask |= POLLERR;
	return (short)(mask & (events | POLLHUP | POLLERR));
}
