/*
 * tx.c - transmit: copy the application's bytes into the ring we own, once.
 *
 * One copy in (here) and one copy out (rx.c) is the kernel's "nocopy" path
 * (docs/background.md): the send buffer *is* the ring the peer reads.  sendfile() reads the file
 * straight into the ring, so a static file costs the same single copy.
 */
#include "io.h"

#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>

/* Validated consumer cursor of the peer on our ring; -1 if the peer lied. */
static int peer_cons(struct conn *c, uint64_t *out)
{
	struct conn_shared *sh = c->sh;
	/* seq_cst: after our write_blocked, against the reader's
	 * publish-then-look (rx_free_writer) */
	uint64_t pc = atomic_load_explicit(&c->rx->cons, memory_order_seq_cst);

	if (!ring_cons_valid(sh->peer_cons_seen, pc, sh->prod)) {
		close_mark_broken(c);
		return -1;
	}
	sh->peer_cons_seen = pc;
	*out = pc;
	return 0;
}

/* Error a write gets now, or 0. */
static int tx_error(struct conn *c)
{
	uint32_t f = atomic_load(&c->sh->flags);
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);
	int err = tcpend_write_error(c);

	if (err)
		return err;
	if (f & SH_SHUT_WR || pf & RING_F_CLOSED)
		return EPIPE;
	/* after a move the doorbell socket's hang-up is the move's (move.c) */
	if (move_seen(c))
		return EXDEV;           /* the caller writes to the TCP socket */
	if (f & SH_PEER_GONE)
		return EPIPE;
	return 0;
}

/*
 * Free space in our ring, waiting for @want bytes of it (1 <= want <= the
 * ring's size) unless @dontwait (or the descriptor is non-blocking).
 * Returns the space, 0 for "would block", or -errno.
 */
static long tx_space(struct conn *c, int fd, uint32_t want, int dontwait)
{
	struct conn_shared *sh = c->sh;
	int filled = 0, spun = 0;

	for (;;) {
		uint64_t pc = sh->peer_cons_seen;
		uint32_t space = ring_space(sh->prod, pc, c->tx_size);
		int err = tx_error(c);

		if (err)
			return -err;
		/* the reader's cursor line is the one it writes as it reads:
		 * fetched only when the last one seen leaves too little room */
		if (space < want && peer_cons(c, &pc) < 0)
			return -ECONNRESET;
		space = ring_space(sh->prod, pc, c->tx_size);
		if (space >= want) {
			if (atomic_load_explicit(&c->tx->write_blocked, memory_order_relaxed))
				atomic_store(&c->tx->write_blocked, 0);
			return space;
		}
		if (!filled && !spun && !dontwait) {
			spun = 1;
			if (spin_for_change(atomic_load_explicit(&sh->nonblock, memory_order_relaxed),
			                    io_spin_peer_cpu(c), &c->rx->cons, sh->peer_cons_seen,
			                    &c->rx->flags))
				continue;       /* the reader made room while we watched */
		}
		if (!atomic_load_explicit(&c->tx->write_blocked, memory_order_relaxed)) {
			/* ask the reader to report progress, then look once more */
			atomic_store_explicit(&c->tx->write_blocked, 1, memory_order_seq_cst);
			continue;
		}
		if (!filled) {
			/* counted first: the room the reader makes is an edge from
			 * here on (epoll_watch.c), whoever's wait sees it */
			atomic_fetch_add_explicit(&sh->nospace, 1, memory_order_relaxed);
			bell_fill(c, fd);       /* our descriptor stops being writable */
			filled = 1;
			continue;
		}
		/* the kernel wakes us when the reader drains our doorbells */
		shared_unlock(&sh->tx_lock);
		int r = bell_wait_writable(fd, dontwait);
		shared_lock(&sh->tx_lock);
		if (r < 0 && move_seen(c))
			return -EXDEV;  /* woken by a move (move.c): the rest goes over TCP */
		if (r == -EAGAIN)
			return 0;
		if (r == -EPIPE) {
			/* the peer hung up: how (a reset if it died with our bytes
			 * unread) is tx_error's to say */
			atomic_fetch_or(&sh->flags, tcpend_hangup_flags(c, POLLHUP));
			if ((err = tx_error(c)))
				return -err;
		}
		if (r < 0)
			return r;
		filled = 0;
	}
}

/*
 * The ring was sealed between our copy and our publish (move.c): the @n
 * bytes at our cursor go over TCP instead, after everything the ring holds
 * - the peer reads the ring up to the seal first.  As a send on the TCP
 * socket would: a non-blocking one takes what fits, a blocking one waits.
 * Returns how many went.  A cursor moved by anyone but a seal is the
 * peer's lie: reset, nothing sent.
 */
static uint32_t tx_publish_failed(struct conn *c, uint64_t raw, uint32_t n, int dontwait)
{
	struct conn_shared *sh = c->sh;
	struct iovec iov[2];
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };
	uint32_t sent = 0;

	if (!ring_prod_sealed(raw, sh->peer_cons_seen, c->tx_size) || raw - RING_PROD_MOVED != sh->prod) {
		close_mark_broken(c);
		return 0;
	}
	/* what the peer asked to have again goes first (move.c); a failure
	 * to has reset the TCP connection, where the send below fails */
	move_seen(c);
	move_resend(c);
	ring_pieces(ring_data(c->tx), c->tx_size, sh->prod, n, iov);
	while (sent < n) {
		struct pollfd p = { .fd = c->tcp_fd, .events = POLLOUT };
		ssize_t k = sys_sendmsg(c->tcp_fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (k < 0 && errno == EAGAIN && !dontwait)
			sys_poll(&p, 1, -1);
		else if (k < 0 && errno != EINTR)
			break;          /* full (non-blocking), or the TCP connection failed */
		for (int i = 0; k > 0 && i < 2; i++) {
			size_t t = (size_t)k < iov[i].iov_len ? (size_t)k : iov[i].iov_len;
			iov[i].iov_base = (char *)iov[i].iov_base + t;
			iov[i].iov_len -= t;
			sent += (uint32_t)t;
			k -= (ssize_t)t;
		}
	}
	return sent;
}

/* Count @n bytes published (standing for @bytes of the stream) and ring. */
static void tx_published(struct conn *c, int fd, uint32_t n, uint64_t bytes)
{
	struct conn_shared *sh = c->sh;

	sh->prod += n;
	conn_count_call(c, CONN_WRITE);
	if (c->slot) {
		atomic_fetch_add_explicit(&c->slot->tx_bytes, bytes, memory_order_relaxed);
		c->slot->tx_fill = (uint32_t)(sh->prod - sh->peer_cons_seen);
	}
	bell_after_produce(c, fd);
}

/* Make @n more bytes of ring visible: 1, or 0 with the cursor found in
 * *@raw - a compare-and-swap, not a store, so a sealed cursor stays sealed
 * (move.c). */
static int tx_publish_cas(struct conn *c, uint32_t n, uint64_t *raw)
{
	*raw = c->sh->prod;
	return atomic_compare_exchange_strong(&c->tx->prod, raw, c->sh->prod + n);
}

/*
 * Publish @n more bytes of ring, standing for @bytes of the stream.
 * Returns how many of the @n went: all, unless the ring was sealed
 * meanwhile - then the TCP socket took them, or (@dontwait) what fit.
 */
static uint32_t tx_publish_as(struct conn *c, int fd, uint32_t n, uint64_t bytes, int dontwait)
{
	uint64_t raw;

	if (!tx_publish_cas(c, n, &raw))
		return tx_publish_failed(c, raw, n, dontwait);
	tx_published(c, fd, n, bytes);
	return n;
}

static uint32_t tx_publish(struct conn *c, int fd, uint32_t n)
{
	return tx_publish_as(c, fd, n, n,
	                     atomic_load_explicit(&c->sh->nonblock, memory_order_relaxed));
}

static ssize_t tx_finish(struct conn *c, ssize_t done, long err, int flags)
{
	if (done > 0)
		return done;    /* an error a reset left stays for the next call */
	if (err == 0)
		return -EAGAIN;
	tcpend_reported(c, (int)-err);
	if (err == -EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	return err;
}

long tx_claim(struct conn *c, int fd, size_t min, struct iovec iov[2], int dontwait)
{
	struct conn_shared *sh = c->sh;
	long space;

	if (min > c->tx_size)
		return -EMSGSIZE;
	if (io_lock(&sh->tx_lock, &c->tx_hold,
	            dontwait || atomic_load_explicit(&sh->nonblock, memory_order_relaxed)) < 0)
		return 0;               /* another thread's claim: would block */
	space = tx_space(c, fd, min ? (uint32_t)min : 1, dontwait);
	if (space <= 0) {
		shared_unlock(&sh->tx_lock);
		return space;
	}
	ring_pieces(ring_data(c->tx), c->tx_size, sh->prod, (size_t)space, iov);
	io_hold_take(&c->tx_hold, (size_t)space);
	return space;
}

void tx_commit(struct conn *c, int fd, size_t n)
{
	io_hold_drop(&c->tx_hold);
	if (n)
		tx_publish(c, fd, (uint32_t)n);
	shared_unlock(&c->sh->tx_lock);
}

void tx_commit_keep(struct conn *c, int fd, size_t n)
{
	if (n) {
		tx_publish(c, fd, (uint32_t)n);
		c->tx_hold.len -= n;
	}
}

void tx_abort(struct conn *c)
{
	io_hold_drop(&c->tx_hold);
	shared_unlock(&c->sh->tx_lock);
}

ssize_t tx_send(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	struct conn_shared *sh = c->sh;
	int dontwait = flags & MSG_DONTWAIT;
	size_t total = 0, done = 0;
	int i = 0;
	size_t off = 0;      /* offset inside iov[i] */
	long space = 0;

	if (flags & MSG_OOB)
		return -EOPNOTSUPP;
	if (io_hold_mine(&c->tx_hold))
		return -EDEADLK;        /* a claim of this thread is not committed */
	for (int k = 0; k < iovcnt; k++)
		total += iov[k].iov_len;
	if (total == 0) {
		/* a zero-length send still reports a broken or closed connection;
		 * to a peer that closed it sends nothing, so draws no reset */
		int err = tx_error(c);
		if (err == EPIPE && !tcpend_reset(c) && !(atomic_load(&sh->flags) & SH_SHUT_WR) &&
		    tcpend_peer_closed(c))
			return 0;
		return err ? tx_finish(c, 0, -err, flags) : 0;
	}
	if (tcpend_discard_write(c))
		return (ssize_t)total;  /* TCP takes it, and the peer's reset follows */
	if (io_lock(&sh->tx_lock, &c->tx_hold,
	            dontwait || atomic_load_explicit(&sh->nonblock, memory_order_relaxed)) < 0)
		return tx_finish(c, 0, 0, flags);  /* another thread's claim: EAGAIN */
	while (done < total && (space = tx_space(c, fd, 1, dontwait)) > 0) {
		uint32_t chunk = 0;

		while (chunk < space && i < iovcnt) {
			size_t n = iov[i].iov_len - off;
			if (n > (size_t)(space - chunk))
				n = (size_t)(space - chunk);
			ring_copy_in(ring_data(c->tx), c->tx_size, sh->prod + chunk,
			             (const char *)iov[i].iov_base + off, n);
			chunk += (uint32_t)n;
			off += n;
			if (off == iov[i].iov_len) {
				i++;
				off = 0;
			}
		}
		uint32_t went = tx_publish_as(c, fd, chunk, chunk, dontwait ||
		                              atomic_load_explicit(&sh->nonblock, memory_order_relaxed));
		done += went;
		if (went < chunk) {
			space = -EXDEV; /* sealed: the TCP socket took only these (move.c) */
			break;
		}
	}
	shared_unlock(&sh->tx_lock);
	return tx_finish(c, (ssize_t)done, space, flags);
}

ssize_t tx_send_prefix(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	struct conn_shared *sh = c->sh;
	ssize_t k;

	shared_lock(&sh->tx_lock);
	if (c->tcp_prefix != CONN_PREFIX_WAIT) {
		shared_unlock(&sh->tx_lock);
		return -EALREADY;
	}
	/* only what changes how the call returns: MSG_MORE would hold the bytes
	 * that must wake the server, and nothing else concerns them */
	k = sys_result(sys_sendmsg(fd, &m, (flags & MSG_NOSIGNAL) | MSG_DONTWAIT));
	if (k > 0) {
		/* the stream's first k bytes: the server puts them at the ring's
		 * head, so ours goes on from there; the doorbell stands for them */
		tx_publish(c, c->bell_fd, (uint32_t)k);
		c->tcp_prefix = (uint64_t)k;
		atomic_store_explicit(&c->tx->tcp_prefix, (uint64_t)k | RING_PREFIX_SET,
		                      memory_order_release);
	}
	shared_unlock(&sh->tx_lock);
	return k;
}

ssize_t tx_send_pending(struct conn *c, const struct iovec *iov, int iovcnt)
{
	struct conn_shared *sh = c->sh;
	size_t total = 0;
	ssize_t rc = -1;

	for (int k = 0; k < iovcnt; k++)
		total += iov[k].iov_len;
	/* once the server has decided (or the wait is over) the next call
	 * settles it; so does a write after first bytes that went over TCP (a
	 * listener that defers accept): a server that declines would wait on
	 * TCP for bytes kept here, and an event loop waiting for its answer
	 * would have nothing to wake it (shim/epoll_early.c) */
	if (atomic_load_explicit(&c->tx->offer, memory_order_acquire) > OFFER_OPEN_SLEEP ||
	    mono_now_ms() >= c->pending_until_ms || c->tcp_prefix)
		return -1;
	shared_lock(&sh->tx_lock);
	/* nobody reads the ring yet: what is there is replayed into TCP if the
	 * offer is withdrawn, so keep it small enough to fit the socket buffers */
	if (atomic_load(&c->pending) == PENDING_OPEN && total > 0 &&
	    sh->prod + total <= PENDING_MAX && sh->prod + total <= c->tx_size) {
		uint64_t pos = sh->prod;
		for (int k = 0; k < iovcnt; k++) {
			ring_copy_in(ring_data(c->tx), c->tx_size, pos, iov[k].iov_base, iov[k].iov_len);
			pos += iov[k].iov_len;
		}
		tx_publish(c, c->bell_fd, (uint32_t)total);
		rc = (ssize_t)total;
	}
	shared_unlock(&sh->tx_lock);
	return rc;
}

ssize_t tx_sendfile(struct conn *c, int fd, int in_fd, off_t *offset, size_t count)
{
	struct conn_shared *sh = c->sh;
	size_t done = 0;
	long space = 0;
	off_t pos = offset ? *offset : 0;

	if (io_hold_mine(&c->tx_hold))
		return -EDEADLK;
	if (count == 0)
		return 0;
	shared_lock(&sh->tx_lock);
	while (done < count && (space = tx_space(c, fd, 1, 0)) > 0) {
		size_t want = count - done < (size_t)space ? count - done : (size_t)space;
		size_t run = ring_contig(c->tx_size, sh->prod, want);
		uint8_t *dst = ring_data(c->tx) + (sh->prod & (c->tx_size - 1));
		ssize_t n = offset ? pread(in_fd, dst, run, pos) : sys_read(in_fd, dst, run);

		if (n <= 0) {
			if (n < 0 && done == 0)
				space = -errno;
			break;
		}
		pos += n;
		tx_publish(c, fd, (uint32_t)n);
		done += (size_t)n;
		if ((size_t)n < run)
			break;  /* a file's end, or all a pipe had: another read might wait */
	}
	shared_unlock(&sh->tx_lock);
	if (offset)
		*offset = pos;
	if (done == 0 && space > 0)
		return 0;           /* end of file */
	return tx_finish(c, (ssize_t)done, space, MSG_NOSIGNAL);
}

long long tx_send_ref(struct conn *c, int fd, uint32_t off, uint32_t len, int dontwait)
{
	struct conn_shared *sh = c->sh;
	struct ring_ref *e;
	uint64_t end, raw;
	long space;

	if (io_hold_mine(&c->tx_hold))
		return -EDEADLK;        /* a claim of this thread is not committed */
	dontwait = dontwait || atomic_load_explicit(&sh->nonblock, memory_order_relaxed);
	if (io_lock(&sh->tx_lock, &c->tx_hold, dontwait) < 0)
		return 0;               /* another thread's claim: would block */
	space = tx_space(c, fd, 1, dontwait);
	if (space <= 0) {
		shared_unlock(&sh->tx_lock);
		return space;
	}
	/* the entry first, then its count, then the placeholder's byte: a
	 * reader that sees the byte produced sees the reference (ring.h) */
	e = &c->tx->ref[sh->ref_prod % RING_REFS];
	atomic_store_explicit(&e->pos, sh->prod, memory_order_relaxed);
	atomic_store_explicit(&e->off, off, memory_order_relaxed);
	atomic_store_explicit(&e->len, len, memory_order_relaxed);
	atomic_store_explicit(&c->tx->ref_prod, ++sh->ref_prod, memory_order_release);
	ring_data(c->tx)[sh->prod & (c->tx_size - 1)] = 0;
	if (!tx_publish_cas(c, 1, &raw)) {
		/* sealed meanwhile (move.c): the reference stands beyond the
		 * seal, where the peer never reads; the buffer stays the
		 * program's, and the send fails */
		atomic_store_explicit(&c->tx->ref_prod, --sh->ref_prod, memory_order_release);
		if (!ring_prod_sealed(raw, sh->peer_cons_seen, c->tx_size))
			close_mark_broken(c);
		shared_unlock(&sh->tx_lock);
		return -EXDEV;
	}
	end = sh->ref_end = sh->prod + 1;
	tx_published(c, fd, 1, len);
	shared_unlock(&sh->tx_lock);
	return (long long)end;
}
