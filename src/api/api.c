/*
 * api.c - the native API (include/smclo.h): claim/commit/abort and
 * peek/consume on any connected TCP socket.
 *
 * The second front end beside the preload shim.  On an accelerated
 * connection a claim or peek is the core's own (tx_claim, rx_peek in io.h):
 * the bytes are the ring's and the direction's lock stays with the thread
 * until the commit or consume.  On anything else it is a copy through
 * staging memory of the thread: a claim hands out the staging buffer and
 * the commit sends it as a send() of it would; a peek copies with MSG_PEEK
 * and the consume discards with MSG_TRUNC, so the kernel's queue stays the
 * one source of truth and recv()s mixed in between stay in order.
 *
 * What a thread holds lives in its own small table (struct hold), with a
 * reference to the connection, and is checked against what its descriptor
 * names at the commit or consume (hold_names): a number closed or reused
 * since reaches nothing.
 */
#include "smclo.h"
#include "api.h"
#include "fdtab.h"

#include "handshake.h"
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#ifndef SMCLO_LIB_VERSION
#define SMCLO_LIB_VERSION "unknown"      /* CMakeLists.txt sets it; tools/lint.sh does not */
#endif

#define HOLDS_MAX     8                 /* claims and peeks one thread keeps at once */
#define STAGE_DEFAULT (64u << 10)       /* a TCP claim's or peek's staging, at least */

enum dir { TX, RX };

struct hold {
	int fd;                 /* -1: free slot */
	dev_t dev;              /* the file @fd named when the hold began (the */
	ino_t ino;              /* copy path's identity check, hold_names) */
	pid_t pid;              /* a fork child's copy of the table is not its own */
	enum dir dir;
	struct conn *c;         /* referenced; NULL: the TCP path */
	size_t len;             /* bytes claimed or peeked (and not committed) */
	size_t off;             /* the TCP path: staged bytes committed already
	                           (SMCLO_KEEP); the claim goes on after them */
	char *stage;            /* the TCP path's memory, kept for the next use */
	size_t cap;
};

static pthread_key_t holds_key;
static pthread_once_t holds_once = PTHREAD_ONCE_INIT;
static _Thread_local struct hold *holds;
static _Thread_local int holds_used;    /* slots in use: 0 makes a lookup free */
static _Thread_local int hold_last;     /* the slot used last: a commit's claim */

/*
 * The thread exits: what it still holds is given up (a claim aborted, a
 * peek released), or the next thread to get its thread-local address would
 * look like the holder.
 */
static void holds_free(void *p)
{
	struct hold *h = p;

	for (int i = 0; i < HOLDS_MAX; i++) {
		if (h[i].c && h[i].pid == sys_getpid())
			close_release_holds(h[i].c);
		if (h[i].c)
			conn_put(h[i].c);
		free(h[i].stage);
	}
	free(h);
	holds = NULL;   /* a later destructor that uses the API makes a new table */
	holds_used = 0;
}

static void holds_key_make(void)
{
	pthread_key_create(&holds_key, holds_free);
}

static void hold_end(struct hold *h);

/*
 * Does @h's descriptor still name what the hold began on?  A close (of the
 * number, or of the last descriptor), a dup2 over it, or a new socket given
 * the same number make a hold stale: its commit or consume must not reach
 * another connection.  A connection's hold asks the descriptor table (no
 * system call); the copy path compares the file's identity.
 */
static int hold_names(const struct hold *h)
{
	return api_names(h->fd, h->c, h->dev, h->ino);
}

int api_names(int fd, const struct conn *c, dev_t dev, ino_t ino)
{
	struct stat st;

	if (c) {
		struct fd_entry *e = fd_entry(fd);
		return e && atomic_load_explicit(&e->conn, memory_order_relaxed) == c;
	}
	return fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* Forget a hold that no longer names its connection (or is a fork parent's),
 * giving back the lock it may still keep. */
static void hold_drop_stale(struct hold *h)
{
	if (h->c && h->pid == sys_getpid()) {
		if (h->dir == TX && io_hold_mine(&h->c->tx_hold))
			tx_abort(h->c);
		else if (h->dir == RX && io_hold_mine(&h->c->rx_hold))
			rx_release(h->c);
	}
	hold_end(h);
}

static int hold_stale(const struct hold *h)
{
	return h->fd >= 0 && (h->pid != sys_getpid() || !hold_names(h));
}

/* This thread's hold of @dir on @fd, or NULL (stale ones are forgotten). */
static struct hold *hold_find(int fd, enum dir dir)
{
	struct hold *hs = holds;

	if (!holds_used)
		return NULL;            /* the common claim: nothing held */
	if (hs[hold_last].fd == fd && hs[hold_last].dir == dir && !hold_stale(&hs[hold_last]))
		return &hs[hold_last];  /* the common commit: the claim just made */
	for (int i = 0; i < HOLDS_MAX; i++)
		if (hs[i].fd == fd && hs[i].dir == dir) {
			if (!hold_stale(&hs[i]))
				return &hs[i];
			hold_drop_stale(&hs[i]);
		}
	return NULL;
}

/* A slot for a new hold of @dir on @fd (its staging memory kept), or NULL. */
static struct hold *hold_new(int fd, enum dir dir)
{
	if (!holds) {
		pthread_once(&holds_once, holds_key_make);
		holds = calloc(HOLDS_MAX, sizeof(*holds));
		if (!holds)
			return NULL;
		for (int i = 0; i < HOLDS_MAX; i++)
			holds[i].fd = -1;
		pthread_setspecific(holds_key, holds);
	}
	for (int i = 0; i < HOLDS_MAX; i++) {
		struct hold *h = &holds[i];

		if (hold_stale(h))
			hold_drop_stale(h);
		if (h->fd < 0) {
			h->fd = fd;
			h->pid = sys_getpid();
			h->dir = dir;
			h->len = 0;
			holds_used++;
			hold_last = i;
			return h;
		}
	}
	return NULL;
}

static void hold_end(struct hold *h)
{
	if (h->c)
		conn_put(h->c);
	if (h->fd >= 0)
		holds_used--;
	h->c = NULL;
	h->fd = -1;
	h->len = 0;
	h->off = 0;
}

int api_fail(int err)
{
	errno = err;
	return -1;
}

/*
 * Why @fd, not a connection smclo carries, cannot take a claim: 0 if it is
 * a connected TCP socket, else ENOTSOCK, EBADF, EOPNOTSUPP (not TCP),
 * ENOTCONN (never connected) or EPIPE (connected once, closed since, as a
 * send() would say).  A peek asks only for TCP: its recv() reports the rest,
 * the end of the stream included.
 */
static int not_tcp(int fd, int for_send)
{
	int type = 0, proto = 0;
	socklen_t l = sizeof(type);
	struct sockaddr_storage ss;
	struct tcp_info ti;     /* a handshake gave it a round-trip time */

	if (sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0)
		return errno;
	l = sizeof(proto);
	if (sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) < 0 ||
	    type != SOCK_STREAM || proto != IPPROTO_TCP)
		return EOPNOTSUPP;      /* the copy path's MSG_TRUNC and peeks are TCP's */
	l = sizeof(ss);
	if (!for_send || sys_getpeername(fd, &ss, &l) == 0)
		return 0;
	l = sizeof(ti);
	if (sys_getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) == 0 && ti.tcpi_rtt > 0)
		return EPIPE;
	return ENOTCONN;
}

/*
 * The accelerated connection behind @fd, referenced, with its handshake
 * decided; NULL with *@err 0 for a TCP socket the copy path can serve, or
 * with *@err set (not_tcp) for one it cannot.
 */
struct conn *api_conn(int fd, int for_send, int *err)
{
	struct conn *c = smclo_active && fd_has_conn(fd) ? fd_get_conn(fd) : NULL;

	*err = 0;
	if (c && atomic_load_explicit(&c->pending, memory_order_relaxed) != PENDING_NONE)
		hs_resolve(fd, c, 0);
	if (c && c->mode == MODE_SHM)
		return c;
	if (c)
		conn_put(c);
	*err = not_tcp(fd, for_send);
	return NULL;
}

/* The staging memory of @h, at least @want bytes. */
static int stage_reserve(struct hold *h, size_t want)
{
	size_t cap = want > STAGE_DEFAULT ? want : STAGE_DEFAULT;
	char *p;

	if (h->cap >= cap)
		return 0;
	p = realloc(h->stage, cap);
	if (!p)
		return -ENOMEM;
	h->stage = p;
	h->cap = cap;
	return 0;
}

static void span_of_stage(struct smclo_span *span, struct hold *h, size_t len)
{
	span->iov[0] = (struct iovec){ h->stage, len };
	span->iov[1] = (struct iovec){ NULL, 0 };
	span->len = len;
	span->via = SMCLO_VIA_COPY;
}

/* A claim or peek in place: in @c's ring, or (a peek) in the peer's pool. */
static void span_of_ring(struct smclo_span *span, const struct conn *c, const struct iovec iov[2],
                         size_t len)
{
	const uint8_t *at = iov[0].iov_base;

	span->iov[0] = iov[0];
	span->iov[1] = iov[1];
	span->len = len;
	span->via = c->rx_pool && at >= c->rx_pool && at < c->rx_pool + c->rx_pool_len
	            ? SMCLO_VIA_POOL : SMCLO_VIA_RING;
}

/* Wait (@timeout ms, -1 for ever) until @fd reports @events; 1, 0, -errno. */
static int wait_for(int fd, short events, int timeout)
{
	struct pollfd p = { .fd = fd, .events = events };
	int r = sys_poll(&p, 1, timeout);

	return r < 0 ? -errno : r;
}

static int nonblocking(int fd)
{
	int fl = sys_fcntl(fd, F_GETFL, 0);

	return fl >= 0 && (fl & O_NONBLOCK);
}

int smclo_send_abort(int fd);
int smclo_recv_consume(int fd, size_t n);

/*
 * Begin a claim (TX) or peek (RX) of the thread on @fd: its previous one
 * there ends (a second claim replaces the first, a second peek looks
 * again), the connection is looked up (*@cp, referenced; NULL for the copy
 * path) and a slot taken (*@hp).  0, or -errno.
 */
static int hold_begin(int fd, enum dir dir, struct hold **hp, struct conn **cp)
{
	int err;

	if (hold_find(fd, dir)) {
		if (dir == TX)
			smclo_send_abort(fd);
		else
			smclo_recv_consume(fd, 0);
	}
	*cp = api_conn(fd, dir == TX, &err);
	if (!*cp && err)
		return -err;
	if (!(*hp = hold_new(fd, dir))) {
		if (*cp)
			conn_put(*cp);
		return -ENOBUFS;
	}
	return 0;
}

/* The claim or peek begun in @h came out as @r bytes (> 0: held), 0 or -errno. */
static ssize_t hold_settle(struct hold *h, struct conn *c, ssize_t r)
{
	if (r <= 0) {
		if (c)
			conn_put(c);
		h->fd = -1;
		holds_used--;
		return r < 0 ? api_fail((int)-r) : 0;
	}
	h->c = c;
	h->len = (size_t)r;
	if (!c) {
		struct stat st;         /* what hold_names checks at the commit or consume */

		if (fstat(h->fd, &st) == 0) {
			h->dev = st.st_dev;
			h->ino = st.st_ino;
		}
	}
	return r;
}

/* ---- sending ------------------------------------------------------------ */

/*
 * A claim of the TCP path: the thread's staging memory.  One that may not
 * wait (the probe form, or a non-blocking socket) is given no more than the
 * socket can take now - the kernel's buffer less what is queued in it - so
 * that its commit does not wait either.
 */
static ssize_t claim_copy(struct hold *h, int fd, size_t min, struct smclo_span *span,
                          int dontwait)
{
	size_t len;
	int r;

	if (min > SMCLO_STAGE_MAX)
		return -EMSGSIZE;
	if ((r = stage_reserve(h, min)) < 0)
		return r;
	len = h->cap;
	if (dontwait) {
		int sndbuf = 0, queued = 0;
		socklen_t l = sizeof(sndbuf);
		size_t room;

		if (sys_getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &l) < 0 ||
		    ioctl(fd, SIOCOUTQ, &queued) < 0)
			return -errno;
		/* SO_SNDBUF reads back doubled, for the kernel's overhead */
		room = sndbuf / 2 > queued ? (size_t)(sndbuf / 2 - queued) : 0;
		if (room < (min ? min : 1))
			return -EAGAIN;
		if (room < len)
			len = room;
	}
	span_of_stage(span, h, len);
	return (ssize_t)len;
}

EXPORT ssize_t smclo_send_claim(int fd, size_t min, struct smclo_span *span, int flags)
{
	struct hold *h;
	struct conn *c;
	struct iovec iov[2];
	int dontwait = flags & SMCLO_DONTWAIT;
	ssize_t r;

	if (!span || (flags & ~SMCLO_DONTWAIT))
		return api_fail(EINVAL);
	if ((r = hold_begin(fd, TX, &h, &c)) < 0)
		return api_fail((int)-r);
	if (!c) {
		r = claim_copy(h, fd, min, span, dontwait || nonblocking(fd));
	} else {
		r = tx_claim(c, fd, min, iov, dontwait);
		if (r == 0)
			r = -EAGAIN;
		if (r > 0)
			span_of_ring(span, c, iov, (size_t)r);
	}
	return hold_settle(h, c, r);
}

/* SO_SNDTIMEO or SO_RCVTIMEO (@opt) of @fd in ms, -1 for none. */
static int sock_timeout_ms(int fd, int opt)
{
	struct timeval tv = { 0 };
	socklen_t l = sizeof(tv);

	if (sys_getsockopt(fd, SOL_SOCKET, opt, &tv, &l) < 0 || (!tv.tv_sec && !tv.tv_usec))
		return -1;
	return (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
}

/* Send the next @n staged bytes as a send() of them would (api_send_all). */
static ssize_t commit_copy(struct hold *h, int fd, size_t n)
{
	return api_send_all(fd, h->stage + h->off, n, 0, NULL);
}

/* One send() of sys_send's, with the flags *@ctx holds. */
static ssize_t send_once_sys(void *ctx, int fd, const void *buf, size_t n)
{
	return sys_send(fd, buf, n, MSG_NOSIGNAL | *(const int *)ctx);
}

ssize_t api_send_all(int fd, const void *buf, size_t n, int flags, unsigned *calls)
{
	return api_send_all_by(fd, buf, n, send_once_sys, &flags, calls);
}

ssize_t api_send_all_by(int fd, const void *buf, size_t n, api_send_once_fn once, void *ctx,
                        unsigned *calls)
{
	int nonblock = nonblocking(fd), looked = 0;
	long long deadline = -1;        /* SO_SNDTIMEO bounds the whole send, as send()'s */
	size_t done = 0;

	while (done < n) {
		ssize_t w = once(ctx, fd, (const char *)buf + done, n - done);
		int r, left = -1;

		if (w > 0) {
			done += (size_t)w;
			if (calls)
				(*calls)++;
			continue;
		}
		if (errno == EINTR && bell_signals_restart())
			continue;
		if ((errno != EAGAIN && errno != EWOULDBLOCK) || nonblock)
			return done ? (ssize_t)done : -errno;
		if (!looked) {
			int t = sock_timeout_ms(fd, SO_SNDTIMEO);

			looked = 1;
			deadline = t < 0 ? -1 : mono_now_ms() + t;
		}
		if (deadline >= 0 && (left = (int)(deadline - mono_now_ms())) <= 0)
			return done ? (ssize_t)done : -EAGAIN;
		r = wait_for(fd, POLLOUT, left);
		if (r == 0 || (r == -EINTR && !bell_signals_restart()))
			return done ? (ssize_t)done : (r ? r : -EAGAIN);
	}
	return (ssize_t)n;
}

EXPORT ssize_t smclo_send_commit(int fd, size_t n, int flags)
{
	struct hold *h = hold_find(fd, TX);
	int keep = flags & SMCLO_KEEP;
	ssize_t r = (ssize_t)n;

	if (!h || n > h->len || (flags & ~SMCLO_KEEP))
		return api_fail(EINVAL);
	if (!h->c)
		r = commit_copy(h, fd, n);
	else if (!io_hold_mine(&h->c->tx_hold))
		r = -EPIPE;             /* given up by this thread's shutdown(SHUT_WR) */
	else if (keep)
		tx_commit_keep(h->c, fd, n);
	else
		tx_commit(h->c, fd, n);
	if (keep && r >= 0) {
		/* the claim goes on after what was published */
		h->len -= (size_t)r;
		h->off += (size_t)r;
		return r;
	}
	if (keep && (r == -EAGAIN || r == -EINTR))
		return api_fail((int)-r);       /* nothing sent: the claim as it was */
	hold_end(h);
	return r < 0 ? api_fail((int)-r) : r;
}

EXPORT int smclo_send_abort(int fd)
{
	struct hold *h = hold_find(fd, TX);

	if (!h)
		return api_fail(EINVAL);
	if (h->c && io_hold_mine(&h->c->tx_hold))
		tx_abort(h->c);
	hold_end(h);
	return 0;
}

/* ---- receiving ---------------------------------------------------------- */

/* The peer shut its sending side (or went away): fewer than asked is all. */
static int peer_done(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };

	return sys_poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/*
 * Before a wait for @min bytes the socket does not hold yet: make sure the
 * kernel will queue them.  Peeked bytes stay in the kernel's queue, and a
 * packet stays charged in full until the last of its bytes is consumed; on
 * loopback the kernel coalesces arriving segments into the last packet (up
 * to 17 fragments, about half a megabyte), so with the default buffer a
 * queue can be full to the kernel with fewer than @min bytes in it and its
 * window shut for ever (seen: 12 KB unread charged 327 KB, the peek waiting
 * for 40 KB).  Linux sizes the receive buffer for an SO_RCVLOWAT it is given
 * and never shrinks it back (autotuning stays on): setting @min plus
 * PEEK_SLACK for such a packet, then the old mark again at once, leaves the
 * buffer grown.  The mark itself must not stay: the kernel wakes a reader
 * only once that many bytes are queued.
 */
#define PEEK_SLACK (1u << 20)

/* 0, or -EMSGSIZE when the buffer cannot be made to hold @min bytes (a
 * program fixed it with SO_RCVBUF, which turns the kernel's sizing off). */
static int rcvbuf_grow(int fd, size_t min)
{
	int v = (int)(min + PEEK_SLACK), cur = 1, buf = 0;
	socklen_t l = sizeof(cur);

	if (sys_getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &cur, &l) == 0 && cur < v &&
	    sys_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0)
		sys_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &cur, sizeof(cur));
	l = sizeof(buf);
	/* about half of the buffer is for payload: what TCP advertises */
	if (sys_getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, &l) == 0 && (size_t)buf / 2 < min)
		return -EMSGSIZE;
	return 0;
}

/*
 * A peek of the TCP path: copy what the socket holds (at least @min, which
 * MSG_WAITALL waits for unless the stream ends) without taking it.  A short
 * count from a waiting peek is a signal (looked again at if its handler has
 * SA_RESTART, else EINTR) or SO_RCVTIMEO (EAGAIN).
 */
static ssize_t peek_copy(struct hold *h, int fd, size_t min, struct smclo_span *span,
                         int dontwait)
{
	int avail = 0, r, timeo = -2;
	long long start = mono_now_ms();
	size_t want;
	ssize_t n;

	if (min > SMCLO_PEEK_MAX)
		return -EMSGSIZE;
	if (ioctl(fd, FIONREAD, &avail) < 0)
		avail = 0;
	want = (size_t)avail > min ? (size_t)avail : min;
	if (want > SMCLO_STAGE_MAX)
		want = SMCLO_STAGE_MAX;
	if ((r = stage_reserve(h, want)) < 0)
		return r;
	if (!dontwait && (size_t)avail < min && (r = rcvbuf_grow(fd, min)) < 0)
		return r;
	for (;;) {
		n = sys_recv(fd, h->stage, want, MSG_PEEK | (dontwait ? MSG_DONTWAIT : MSG_WAITALL));
		if (n < 0 && (errno != EINTR || dontwait || !bell_signals_restart()))
			return -errno;
		if (n == 0 || (size_t)n >= min || peer_done(fd))
			break;
		if (n > 0 && dontwait)
			return -EAGAIN;         /* too few now */
		if (timeo == -2)
			timeo = sock_timeout_ms(fd, SO_RCVTIMEO);
		if (timeo >= 0 && mono_now_ms() - start >= timeo)
			return -EAGAIN;
		if (n > 0 && !bell_signals_restart())
			return -EINTR;
	}
	span_of_stage(span, h, (size_t)n);
	return n;
}

EXPORT ssize_t smclo_recv_peek(int fd, size_t min, struct smclo_span *span, int flags)
{
	struct hold *h;
	struct conn *c;
	struct iovec iov[2];
	int dontwait = flags & SMCLO_DONTWAIT;
	ssize_t r;

	if (!span || (flags & ~SMCLO_DONTWAIT))
		return api_fail(EINVAL);
	if ((r = hold_begin(fd, RX, &h, &c)) < 0)
		return api_fail((int)-r);
	if (!c) {
		r = peek_copy(h, fd, min ? min : 1, span, dontwait || nonblocking(fd));
	} else {
		r = rx_peek(c, fd, min, iov, dontwait);
		if (r > 0)
			span_of_ring(span, c, iov, (size_t)r);
	}
	if (r == 0)             /* the end of the stream: an empty span */
		*span = (struct smclo_span){ .via = c ? SMCLO_VIA_RING : SMCLO_VIA_COPY };
	return hold_settle(h, c, r);
}

/* Take @n bytes the peek saw off the socket's queue (they are there). */
static int consume_copy(int fd, size_t n)
{
	while (n) {
		ssize_t d = sys_recv(fd, NULL, n, MSG_TRUNC | MSG_DONTWAIT);

		if (d > 0)
			n -= (size_t)d;
		else if (d == 0)
			return -ECONNRESET;     /* taken by someone else: the peek lied */
		else if (errno != EINTR)
			return -errno;
	}
	return 0;
}

EXPORT int smclo_recv_consume(int fd, size_t n)
{
	struct hold *h = hold_find(fd, RX);
	int r = 0;

	if (!h || n > h->len)
		return api_fail(EINVAL);
	if (!h->c)
		r = consume_copy(fd, n);
	else if (io_hold_mine(&h->c->rx_hold))
		rx_consume(h->c, fd, n);
	else
		r = -EPIPE;             /* given up meanwhile (the peek is not ours) */
	hold_end(h);
	return r < 0 ? api_fail(-r) : 0;
}

/* ---- about the connection ----------------------------------------------- */

EXPORT int smclo_via(int fd)
{
	int err;
	struct conn *c = api_conn(fd, 1, &err);

	if (c) {
		conn_put(c);
		return SMCLO_VIA_RING;
	}
	return err ? api_fail(err) : SMCLO_VIA_COPY;
}

EXPORT const char *smclo_version(void)
{
	return SMCLO_LIB_VERSION;
}
