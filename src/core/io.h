/*
 * io.h - the data path of an accelerated connection: doorbells (bell.c),
 * transmit (tx.c), receive (rx.c), close and shutdown (close.c), and the
 * hooks it calls the layers above through (io_hooks, io.c).
 *
 * Doorbell protocol, in one paragraph (docs/design.md has the argument):
 * a doorbell is a zero-length message on the SEQPACKET socket; it is what
 * makes the reader's descriptor readable.  The writer logs the producer
 * cursor each doorbell stands for in its region.  The reader keeps at least
 * one doorbell queued while unread data remains and drains stale ones (value
 * <= its consumer cursor) only after publishing its cursor and seeing the
 * ring empty, so level-triggered readiness never goes missing.  The writer
 * rings only when the last doorbell it sent is no longer live (the reader's
 * published cursor passed it), so a reader that keeps up costs no system
 * calls.  A writer that finds the ring full raises write_blocked and sends
 * doorbells until its own descriptor is unwritable; the reader drains them
 * once it has freed a quarter of the ring, and the kernel wakes the writer
 * with EPOLLOUT.
 */
#ifndef SMCLO_IO_H
#define SMCLO_IO_H

#include "conn.h"
#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>

/*
 * What the data path needs from the layers above it (io.c): calls go only
 * downward, and upward through these.  runtime/init.c sets the library's
 * once at start, before any connection exists (every member given; the
 * table must outlive the process); until then, and in a core linked without
 * a front end (unit tests, fuzzers), io.c's own answer.
 */
struct io_hooks {
	/* this thread is about to sleep in a wait: event loops that watch
	 * rings stop watching for it (epoll_watch.c) */
	void (*thread_sleeps)(void);
	/* SO_RCVTIMEO of @fd, the descriptor of @c, in ms; 0 for none */
	int (*rcvtimeo_ms)(struct conn *c, int fd);
	/* keep @fd as one of smclo's own, out of the program's way; returns
	 * the number it has now */
	int (*keep_fd)(int fd);
	/* a copy of @fd kept as one of smclo's own, or -1; @if_spare: only if
	 * the process can spare a descriptor for it (regions kept for a
	 * hand-over must not eat a server's capacity) */
	int (*keep_copy)(int fd, int if_spare);
	/* is @fd still one smclo keeps (kept with keep_fd, not closed or
	 * taken over by the program since)? */
	int (*is_kept)(int fd);
	/* the switch is about to put another socket at @fd (swap_begin), and
	 * has (swap_end): epoll registrations made before connect() follow it
	 * (shim/epoll_early.c) */
	void (*swap_begin)(int fd);
	void (*swap_end)(int fd);
	/* a pending connection's first bytes went over TCP: the epoll sets
	 * that hold @fd watch its doorbell @bell too, so a program asleep
	 * there wakes at the server's answer, whichever way it comes (0, or -1:
	 * decide now instead); bell_unwatch ends that before the decision puts
	 * the doorbell at @fd or closes it (shim/epoll_early.c) */
	int (*bell_watch)(int fd, int bell);
	void (*bell_unwatch)(int fd);
};
void io_set_hooks(const struct io_hooks *h);
void io_thread_sleeps(void);
int io_rcvtimeo_ms(struct conn *c, int fd);
int io_keep_fd(int fd);
int io_keep_copy(int fd, int if_spare);
int io_is_kept(int fd);
void io_swap_begin(int fd);
void io_swap_end(int fd);
int io_bell_watch(int fd, int bell);
void io_bell_unwatch(int fd);

/* bell.c */
#define SIDE_SNDBUF 6500    /* the doorbell socket's; the kernel doubles it: ~4 doorbells
                               writable, ~17 to full (bell_fill) */
void bell_after_produce(struct conn *c, int fd);
void bell_fill(struct conn *c, int fd);
/* Block until the peer drains doorbells (0), or -errno; honours SO_SNDTIMEO. */
int bell_wait_writable(int fd, int dontwait);
void bell_drain(struct conn *c, int fd, int keep_one);
/* The same, live ones too: a reader under SO_RCVLOWAT whose unread bytes
 * are below the mark (the writer rings again when they reach it). */
void bell_drain_live(struct conn *c, int fd, uint64_t lowat);
/*
 * Hand our pool's @memfd and @wakefd to the peer with one doorbell (it
 * stands for our producer cursor as any other).  0 or -errno.
 */
int bell_send_pool(struct conn *c, int fd, int memfd, int wakefd);
/* Wake the peer if it sleeps on its futex word (it reads what we produced). */
void bell_wake_sleeper(struct conn *c);
/* Move a futex word on and wake whoever sleeps on it. */
void bell_wake_word(_Atomic uint32_t *word);
/*
 * Sleep on our futex word while it still holds @seq, for a short while: 0
 * when woken (look again), BELL_SLEEP_ON when the caller should go on
 * sleeping on the doorbell socket, -EAGAIN when SO_RCVTIMEO expired, -EINTR.
 */
#define BELL_SLEEP_ON 2
int bell_sleep(struct conn *c, int fd, uint32_t seq);
/* Does every installed signal handler have SA_RESTART (a read goes on)? */
int bell_signals_restart(void);
/*
 * SH_PEER_GONE and/or SH_PEER_SHUT as @c's doorbell socket @fd reports them
 * now.  Once both sides shut down writing the socket hangs up whether the
 * peer lives or not: then only its CLOSED (or ABORT) says it is gone.
 */
uint32_t bell_hangup_flags(const struct conn *c, int fd);

/*
 * Claims and peeks (the native API, smclo.h): the transmit or receive lock
 * stays with the calling thread from the claim to its commit (or abort), from
 * the peek to its consume, so no other byte enters or leaves the stream in
 * between.  These say whether this thread of this process holds @h.
 */
extern _Thread_local char io_thread_token;
static inline int io_hold_mine(const struct io_hold *h)
{
	return atomic_load_explicit(&h->thread, memory_order_relaxed) == &io_thread_token &&
	       h->pid == sys_getpid();
}
static inline void io_hold_take(struct io_hold *h, size_t len)
{
	h->pid = sys_getpid();
	h->len = len;
	atomic_store_explicit(&h->thread, &io_thread_token, memory_order_relaxed);
}
static inline void io_hold_drop(struct io_hold *h)
{
	atomic_store_explicit(&h->thread, NULL, memory_order_relaxed);
	h->len = 0;
}
/*
 * Take a direction's lock (@m, its hold @h) for a call that may not wait
 * (@dontwait) or may: while another thread keeps the direction with a claim
 * or peek - which lasts as long as that program likes - a call that may not
 * wait gets -EAGAIN instead of waiting for its commit or consume.  Other
 * holders keep the lock for a copy at most, and are waited for.  0 or -EAGAIN.
 */
static inline int io_lock(pthread_mutex_t *m, const struct io_hold *h, int dontwait)
{
	if (dontwait && atomic_load_explicit(&h->thread, memory_order_relaxed)) {
		int r = pthread_mutex_trylock(m);

		if (r == EBUSY)
			return -EAGAIN;
		if (r == EOWNERDEAD)
			pthread_mutex_consistent(m);
		return 0;
	}
	shared_lock(m);
	return 0;
}

/* Give up whatever claim and peek this thread holds on @c (close.c: before
 * a close, which takes the locks itself). */
void close_release_holds(struct conn *c);

/* tx.c */
/*
 * Claim the free space of our ring, at least @min bytes (1 if 0), as one
 * piece or two where the ring wraps (@iov[1] empty otherwise), waiting for
 * it unless @dontwait.  Returns the bytes claimed with the transmit lock
 * held, 0 for "would block", or -errno (-EMSGSIZE: @min exceeds the ring).
 */
long tx_claim(struct conn *c, int fd, size_t min, struct iovec iov[2], int dontwait);
/* Publish the first @n claimed bytes (n <= the claim) and release. */
void tx_commit(struct conn *c, int fd, size_t n);
/* Publish the first @n claimed bytes and keep the rest claimed (the lock
 * stays): many messages of one claim, each the peer's as it is committed. */
void tx_commit_keep(struct conn *c, int fd, size_t n);
/* Release a claim without publishing anything. */
void tx_abort(struct conn *c);
/*
 * send() on @c: the bytes taken (waiting for room unless MSG_DONTWAIT or
 * the descriptor is non-blocking), or -errno (SIGPIPE raised for -EPIPE
 * without MSG_NOSIGNAL).  Every call of this file and rx.c returns -errno,
 * as liburing's do; the shim turns it into -1 and errno at the libc boundary.
 */
ssize_t tx_send(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags);
/*
 * A write before the handshake is decided (client.c, pending): all of it goes into
 * the ring, with its doorbell on c->bell_fd, if it fits within PENDING_MAX
 * bytes in all; else nothing is written and -1 says "decide first".
 */
#define PENDING_MAX (16u << 10)
ssize_t tx_send_pending(struct conn *c, const struct iovec *iov, int iovcnt);
/*
 * The first write of a connection pending to a listener that defers accept
 * (c->tcp_prefix CONN_PREFIX_WAIT): over TCP, through @fd (still the TCP
 * socket), with the program's @flags; what was sent becomes the stream's
 * head, published in the ring header for the server.  Bytes sent, or -errno
 * (-EALREADY: the first write went already).
 */
ssize_t tx_send_prefix(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags);
/* sendfile() into @c: bytes taken, 0 at the file's end, or -errno.  A
 * short read of @in_fd (a pipe's contents) ends it, as splice ends. */
ssize_t tx_sendfile(struct conn *c, int fd, int in_fd, off_t *offset, size_t count);
/*
 * Put a reference to the @len bytes at offset @off of our pool into the
 * stream (one placeholder byte of the ring, ring.h), waiting for that byte's
 * space unless @dontwait.  The peer must have mapped the pool (pool_ack) and
 * the caller keeps at most RING_REFS references unconsumed (pool.c: one per
 * buffer, RING_REFS buffers at most).  Returns the stream position just past
 * the placeholder - the reference is consumed once the peer's consumer
 * cursor reaches it - 0 for "would block", or -errno.
 */
long long tx_send_ref(struct conn *c, int fd, uint32_t off, uint32_t len, int dontwait);

/* rx.c */
/*
 * The unread bytes where they lie in the peer's ring or pool (read-only), at
 * least @min of them (1 if 0; fewer only where the stream ends, or where a
 * run of pool bytes begins or ends: one run in one place), waiting unless
 * @dontwait.  Returns their count with the receive lock held, 0 at the end of
 * the stream, or -errno (-EMSGSIZE: @min exceeds the ring).  The peer can
 * still write there: the bytes are its word, never our memory's bounds.
 */
long rx_peek(struct conn *c, int fd, size_t min, struct iovec iov[2], int dontwait);
/* Consume the first @n peeked bytes (n <= the peek) and release. */
void rx_consume(struct conn *c, int fd, size_t n);
/* Release a peek without consuming anything. */
void rx_release(struct conn *c);
/* recv() on @c with its flags: bytes read, 0 at the end of the stream, or -errno. */
ssize_t rx_recv(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags);
/*
 * A signal interrupted this thread's wait for the handshake's decision
 * (hs_resolve, for a read): the read fails with EINTR where it would wait.
 */
void rx_note_interrupted(void);
uint32_t rx_available(struct conn *c);
/*
 * Unread bytes in the ring right now, without the lock: a hint for readiness
 * (epoll_watch.c, pollwait.c); the read that follows checks everything properly.
 */
/* The peer's producer cursor, a sealed one (move.c) as the cursor it seals. */
/*
 * The program waits for edges (EPOLLET) or signals (O_ASYNC) on @c: on TCP
 * every arrival raises one, so the peer rings for every produce from now on,
 * not only when its last doorbell was taken (bell.c).  Kept for the
 * connection's life: it costs only readers that leave bytes unread.
 */
static inline void io_bell_each(struct conn *c)
{
	if (!atomic_load_explicit(&c->tx->bell_each, memory_order_relaxed))
		atomic_store_explicit(&c->tx->bell_each, 1, memory_order_relaxed);
}

/* Writable as TCP says it (no lock: a readiness answer): room in our ring,
 * or our side shut down (a write fails at once). */
/*
 * Where the peer last ran (0: not known) - where it is decides whether
 * watching for it pays, and how (spin.h); the word is only compared,
 * never trusted.  io_spin_peer_cpu, before a connection's own wait, notes
 * ours for the peer's waits first (every produce and every consume it
 * publishes note it too: bell.c, rx.c); a wait over many connections only
 * reads theirs.
 */
static inline uint32_t io_peer_cpu(const struct conn *c)
{
	return atomic_load_explicit(&c->rx->cpu, memory_order_relaxed);
}

static inline uint32_t io_spin_peer_cpu(struct conn *c)
{
	spin_note_cpu(&c->tx->cpu);
	return io_peer_cpu(c);
}

static inline int tx_has_room(const struct conn *c)
{
	uint64_t prod = atomic_load_explicit(&c->tx->prod, memory_order_relaxed);

	return prod - atomic_load_explicit(&c->rx->cons, memory_order_relaxed) < c->tx_size ||
	       (atomic_load_explicit(&c->sh->flags, memory_order_relaxed) & SH_SHUT_WR);
}

static inline uint64_t rx_prod_now(const struct conn *c)
{
	uint64_t p = atomic_load_explicit(&c->rx->prod, memory_order_seq_cst);
	uint64_t cons = __atomic_load_n(&c->sh->cons, __ATOMIC_RELAXED);

	/* asked to be sent again over TCP (move.c): nothing more here */
	if (atomic_load_explicit(&c->sh->flags, memory_order_acquire) & SH_RESEND)
		return cons;
	return ring_prod_sealed(p, cons, c->rx_size) ? p - RING_PROD_MOVED : p;
}

static inline int rx_has_unread(struct conn *c)
{
	return rx_prod_now(c) != __atomic_load_n(&c->sh->cons, __ATOMIC_RELAXED);
}

/* SO_RCVLOWAT: unread bytes that make the connection readable (1 unless set). */
static inline uint64_t rx_lowat(const struct conn *c)
{
	uint32_t v = atomic_load_explicit(&c->sh->rcvlowat, memory_order_relaxed);

	return v ? v : 1;
}

/* Readable for poll, select and epoll: SO_RCVLOWAT's bytes, as TCP's. */
static inline int rx_lowat_met(const struct conn *c)
{
	uint64_t n = rx_prod_now(c) - __atomic_load_n(&c->sh->cons, __ATOMIC_RELAXED);

	return n && n >= rx_lowat(c);
}

/* Once this process follows a move to TCP (move.c): the end the peer
 * published in the ring before it, which no FIN may ever say on TCP. */
static inline int rx_ring_end_left(struct conn *c)
{
	return atomic_load_explicit(&c->moved_here, memory_order_relaxed) &&
	       !(atomic_load_explicit(&c->sh->flags, memory_order_relaxed) & SH_RESEND) &&
	       (atomic_load_explicit(&c->rx->flags, memory_order_acquire) &
	        (RING_F_SHUTDOWN | RING_F_CLOSED | RING_F_ABORT));
}

/* What the ring still holds for a read: bytes, or such an end. */
static inline int rx_ring_holds(struct conn *c)
{
	return rx_has_unread(c) || rx_ring_end_left(c);
}

/* Readable by what the ring holds, for poll, select and epoll (SO_RCVLOWAT). */
static inline int rx_ring_readable(struct conn *c)
{
	return rx_lowat_met(c) || rx_ring_end_left(c);
}

/*
 * The kernel says @fd is readable: if the ring holds fewer bytes than
 * SO_RCVLOWAT (1: it is empty) and the stream has not ended, that can only
 * be doorbells - for bytes read already (epoll_watch.c reads without waiting
 * for them), or too few to count.  Consume them; returns 1 if nothing
 * readable is left, 0 otherwise.
 */
int rx_settle_bells(struct conn *c, int fd);
/* Validated peer producer cursor; marks the connection broken if invalid. */
int rx_peer_prod(struct conn *c, uint64_t *prod);

/*
 * move.c: the connection goes on over its TCP socket (a seccomp filter
 * ahead, say).  move_start seals both rings and wakes the waiters on the
 * ring words: 0, or -EOPNOTSUPP for a connection with no TCP beneath (the
 * direct handshake).  move_hang_up(@bell_fd) shuts the doorbell socket,
 * waking everyone in poll or epoll on either side; @bell_fd must still be
 * the doorbell (its caller keeps it from being swapped meanwhile).
 * move_seen: has either side moved @c?  (It seals our side too, once.)
 * Calls that find it moved and their ring empty fail with -EXDEV: the
 * caller goes on with the TCP socket.
 */
int move_possible(const struct conn *c);
int move_start(struct conn *c, int reason);
/*
 * A hand-on ("sent again", move.c).  move_ask_resend: before sealing, with
 * our consumer cursor final (rx_lock held), ask the peer for what we have
 * not read of its stream over TCP; 0, or -1 if it cannot (pool references
 * among those bytes).  move_resent: 1 once the peer has sent it all, -1 if
 * it never will (it could not, or closed), 0 while it may; the peer's word
 * in *@word (to wait on).  move_resend: the peer's side, tx_lock held:
 * send it, before any byte of ours over TCP; 0 when done or not asked, -1
 * if it could not be (the TCP connection is then reset).
 * move_resend_locked: the same, taking the lock only when there is
 * something to send.  move_shutdown_wr: a shutdown that met the seal goes
 * to TCP too, after what is sent again.
 */
int move_ask_resend(struct conn *c);
int move_resent(struct conn *c, uint32_t *word);
int move_resend(struct conn *c);
int move_resend_locked(struct conn *c);
/* Only what was asked for (an asker waiting for its own peer's word serves
 * the peer's ask meanwhile: both sides handing on at once). */
int move_resend_asked(struct conn *c);
void move_shutdown_wr(struct conn *c);
void move_hang_up(int bell_fd);
int move_seen(struct conn *c);
/* The same question without sealing anything, for const callers: a moved
 * flag on a connection that cannot follow is a lie (move_seen resets it). */
static inline int move_flagged(const struct conn *c)
{
	return (atomic_load_explicit(&c->sh->flags, memory_order_acquire) & SH_MOVED) ||
	       ((atomic_load_explicit(&c->rx->flags, memory_order_acquire) & RING_F_MOVED) &&
	        !c->direct && c->tcp_fd >= 0);
}

/*
 * tcpend.c: the end of @c as a TCP socket reports it.  tcpend_reset: is
 * @c reset (latched from what the rings and the doorbell showed)?
 * tcpend_take_error: the error a reset left pending, once (SO_ERROR, a read
 * that found the ring empty), else 0.  tcpend_write_error: what a write
 * fails with after a reset (the pending error, else EPIPE), 0 if not reset;
 * tcpend_reported: a call failed with @err - if that was the pending error,
 * it is taken (a write that sent something leaves it for the next call).
 * tcpend_discard_write: the peer closed and this is the first write since:
 * 1 - its bytes are dropped as TCP drops them, and the reset it draws
 * leaves EPIPE pending.  tcpend_hangup_flags: the SH_PEER_* a doorbell
 * socket's poll @revents say.  tcpend_poll_events: @revents the kernel
 * gave for @c's doorbell socket, made what TCP would say for @events.
 */
int tcpend_reset(struct conn *c);
int tcpend_take_error(struct conn *c);
/* What a read of a reset @c that found its ring empty fails with (taken),
 * or 0: it reads the end. */
int tcpend_read_error(struct conn *c);
int tcpend_write_error(struct conn *c);
void tcpend_reported(struct conn *c, int err);
int tcpend_peer_closed(const struct conn *c);
int tcpend_discard_write(struct conn *c);
uint32_t tcpend_hangup_flags(const struct conn *c, short revents);
short tcpend_poll_events(struct conn *c, short revents, short events);

/* close.c */
/* shutdown() on @c: 0 or -errno. */
int close_shutdown(struct conn *c, int fd, int how);
void close_mark_broken(struct conn *c);
/* The last holder is done with @c: CLOSED (and ABORT if @abort or unread
 * bytes are thrown away) for the peer to read after our last byte. */
void close_publish(struct conn *c, int abort);
/*
 * @c's descriptors all close at the exec (close-on-exec): this process
 * stops holding it, as a close() would say.  1 if another holder remains
 * (the count can be given back if the exec fails), 0 if not.
 */
int close_leave_at_exec(struct conn *c);


#endif
