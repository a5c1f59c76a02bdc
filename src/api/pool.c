/*
 * pool.c - buffer pools: zero-copy sends with two completions each
 * (include/smclo.h, docs/api.md; the ideas: docs/background.md sections 2 and 3).
 *
 * A pool is a sealed memfd of this process carved into equal buffers
 * (page_frag style: reused, never handed to a third process) for one
 * connection.  On a ring the memfd and one end of a socket pair go to the
 * peer with a doorbell (bell_send_pool); once the peer says it mapped the pool
 * (pool_ack in its ring header) a send is one placeholder byte and a
 * reference in our ring (tx_send_ref), and the peer reads the buffer where
 * it lies.  It is done with the buffer when its consumer cursor passes the
 * placeholder - the cursor the kernel's design already has tells us which
 * buffers are free, in order - and it sends a byte on the socket pair so
 * that a program polling smclo_pool_fd() wakes up.  Before the peer's acknowledgement, and
 * on TCP, a send copies (tx_send, or send()) and is notified at once, with
 * SMCLO_CQE_F_COPIED.
 *
 * Completions are io_uring's final zero-copy model: the request's (F_MORE:
 * a notification follows) and the notification (F_NOTIF), notifications of
 * consecutive sends merged.  A buffer comes back only when its notification
 * is reaped, so buffers out plus completions queued are bounded by the
 * pool's size whatever the peer does: a peer that never reads makes
 * smclo_pool_get() fail with ENOBUFS, nothing grows.
 *
 * Every call is of one thread at a time per pool (the program's to
 * serialise, as for an io_uring); the pool's lock makes concurrent misuse
 * harmless, not meaningful.
 */
#include "smclo.h"
#include "api.h"
#include "fdtab.h"
#include "io.h"
#include "kernelzc.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096u

enum buf_state {
	BUF_FREE,       /* smclo_pool_get may hand it out */
	BUF_APP,        /* the program's: got, not sent */
	BUF_SENT,       /* a reference in the ring, or a kernel zero-copy send, not done */
	BUF_DONE,       /* notified (queued), given back when the notification is reaped */
};

struct buf {
	enum buf_state state;
	uint64_t seq;           /* the send that took it */
	uint64_t end;           /* BUF_SENT by reference: the stream position that releases it */
	unsigned long long user_data;
};

/* A queued completion; a notification covers sends first_seq .. + count - 1. */
struct cq_entry {
	struct smclo_cqe cqe;
	uint64_t first_seq;
};

struct smclo_pool {
	pthread_mutex_t lock;
	pid_t owner;
	int fd;                 /* the connection's descriptor */
	struct conn *c;         /* referenced; NULL on TCP */
	dev_t dev;              /* TCP: the socket's identity (api_names) */
	ino_t ino;
	int memfd;
	uint8_t *base;
	size_t buf_size;
	unsigned nbufs;
	struct buf bufs[SMCLO_POOL_BUFS_MAX];
	uint64_t next_seq;
	int announced;          /* the memfd went to the peer */
	int peer_gone;          /* everything out was reclaimed */
	uint64_t cons_seen;     /* the peer's cursor, never taken backwards */
	struct kernel_zc kzc;   /* TCP to another host: the kernel's zero copy */
	int efd;                /* our own wake-up: never leaves this process */
	int release_fd;         /* the peer's "released" messages arrive here, */
	int peer_release_fd;    /* sent from this other end, the peer's once handed over */
	int epfd;               /* smclo_pool_fd(): efd, release_fd, the connection's hang-up */
	int hup_watched;        /* the connection's descriptor is in epfd */
	struct cq_entry *cq;    /* ring of completions */
	unsigned cq_cap, cq_head, cq_len;
};

static int cq_push(struct smclo_pool *p, const struct smclo_cqe *cqe, uint64_t seq)
{
	if (p->cq_len == p->cq_cap)
		return -1;      /* cannot happen: two entries per buffer at most */
	p->cq[(p->cq_head + p->cq_len++) % p->cq_cap] = (struct cq_entry){ *cqe, seq };
	return 0;
}

static void wake(struct smclo_pool *p)
{
	uint64_t one = 1;

	if (sys_write(p->efd, &one, sizeof(one)) < 0)
		return;         /* the counter is at its maximum: readable anyway */
}

/* Count a notified send in the registry's totals (`smclo stats`). */
static void count_send(unsigned flags)
{
	_Atomic uint64_t *n;

	if (!totals)
		return;
	if (flags & SMCLO_CQE_F_RECLAIMED)
		n = &totals->pool_sends_reclaimed;
	else if (flags & SMCLO_CQE_F_KERNEL)
		n = &totals->pool_sends_kernel;
	else if (flags & SMCLO_CQE_F_COPIED)
		n = &totals->pool_sends_copied;
	else
		n = &totals->pool_sends_by_reference;
	atomic_fetch_add_explicit(n, 1, memory_order_relaxed);
}

/* Queue the notification of send @b (merged with the last queued one when
 * that covers the sends just before it, of the same kind). */
static void notify(struct smclo_pool *p, struct buf *b, unsigned flags)
{
	struct cq_entry *last = p->cq_len ? &p->cq[(p->cq_head + p->cq_len - 1) % p->cq_cap] : NULL;

	count_send(flags);
	b->state = BUF_DONE;
	flags |= SMCLO_CQE_F_NOTIF;
	if (last && last->cqe.flags == flags && last->first_seq + last->cqe.count == b->seq) {
		last->cqe.count++;
		return;
	}
	cq_push(p, &(struct smclo_cqe){ .user_data = b->user_data, .flags = flags, .count = 1 },
	        b->seq);
}

/* ---- making and freeing a pool -------------------------------------------- */

static int pool_memory(struct smclo_pool *p, size_t len)
{
	p->memfd = memfd_create("smclo-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (p->memfd < 0)
		return -errno;
	p->memfd = io_keep_fd(p->memfd);
	if (ftruncate(p->memfd, (off_t)len) < 0)
		return -errno;
	p->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
	if (p->base == MAP_FAILED) {
		p->base = NULL;
		return -ENOMEM;
	}
	/* after our writable mapping: nobody maps it writable again, nobody
	 * changes its size (the peer's reads stay inside it) */
	if (sys_fcntl(p->memfd, F_ADD_SEALS,
	              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
		return -errno;
	return 0;
}

/*
 * The pool's descriptor and what makes it readable.  The peer's wake-ups
 * come over a socket pair, not a shared eventfd: a descriptor passed to
 * another process shares its open file with it, O_NONBLOCK included, and
 * a peer that cleared it (or filled an eventfd's counter) would make our
 * next read or write block for ever.  Socket calls take MSG_DONTWAIT per
 * call, which nobody else can change.
 */
static int pool_wakeups(struct smclo_pool *p)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int sv[2];

	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->efd < 0)
		return -errno;
	p->efd = io_keep_fd(p->efd);
	p->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (p->epfd < 0)
		return -errno;
	p->epfd = io_keep_fd(p->epfd);
	if (sys_epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->efd, &ev) < 0)
		return -errno;
	if (!p->c)
		return 0;
	if (sys_socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	p->release_fd = io_keep_fd(sv[0]);
	p->peer_release_fd = io_keep_fd(sv[1]);
	if (sys_epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->release_fd, &ev) < 0)
		return -errno;
	/* no events asked: the kernel still reports the peer's hang-up */
	ev.events = 0;
	if (sys_epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->fd, &ev) < 0)
		return -errno;
	p->hup_watched = 1;
	return 0;
}

/* Take the peer's "released" messages (a bounded number: a peer that
 * floods them keeps the descriptor readable, it cannot keep us here). */
static void take_releases(struct smclo_pool *p)
{
	char b[8];

	for (int i = 0; p->release_fd >= 0 && i < 64; i++) {
		ssize_t n = sys_recv(p->release_fd, b, sizeof(b), MSG_DONTWAIT);

		if (n > 0)
			continue;
		if (n == 0) {
			/* the peer closed its end (peer_finished): nothing more
			 * comes, and the end of file would keep the pool's
			 * descriptor readable */
			sys_epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->release_fd, NULL);
			sys_close(p->release_fd);
			p->release_fd = -1;
		}
		break;
	}
}

static void pool_free(struct smclo_pool *p)
{
	kernel_zc_free(&p->kzc);
	if (p->base)
		munmap(p->base, (size_t)p->nbufs * p->buf_size);
	if (p->memfd >= 0)
		sys_close(p->memfd);
	if (p->efd >= 0)
		sys_close(p->efd);
	if (p->release_fd >= 0)
		sys_close(p->release_fd);
	if (p->peer_release_fd >= 0)
		sys_close(p->peer_release_fd);
	if (p->epfd >= 0)
		sys_close(p->epfd);
	if (p->c)
		conn_put(p->c);
	pthread_mutex_destroy(&p->lock);
	free(p->cq);
	free(p);
}

/* Hand the pool to the peer, if not done yet; a full doorbell socket: later. */
static void announce(struct smclo_pool *p)
{
	/* the doorbell takes the transmit lock: not while this thread's own
	 * claim holds it (its send then fails with EDEADLK, tx_send_ref) */
	if (!p->announced && !io_hold_mine(&p->c->tx_hold) &&
	    bell_send_pool(p->c, p->fd, p->memfd, p->peer_release_fd) == 0) {
		p->announced = 1;
		sys_close(p->peer_release_fd);  /* the peer's now */
		p->peer_release_fd = -1;
	}
}

EXPORT struct smclo_pool *smclo_pool_create(int fd, size_t buf_size, unsigned nbufs, int flags)
{
	struct smclo_pool *p;
	struct stat st;
	size_t len;
	int err, made = 0;

	if (flags || nbufs == 0 || nbufs > SMCLO_POOL_BUFS_MAX || buf_size == 0 ||
	    buf_size > SMCLO_POOL_MAX) {
		api_fail(EINVAL);
		return NULL;
	}
	buf_size = (buf_size + PAGE - 1) / PAGE * PAGE;
	len = buf_size * nbufs;
	if (len > SMCLO_POOL_MAX) {
		api_fail(EINVAL);
		return NULL;
	}
	if (!(p = calloc(1, sizeof(*p))) || !(p->cq = calloc(2 * nbufs, sizeof(*p->cq)))) {
		free(p);
		api_fail(ENOMEM);
		return NULL;
	}
	pthread_mutex_init(&p->lock, NULL);
	p->owner = getpid();
	p->fd = fd;
	p->memfd = p->efd = p->epfd = p->release_fd = p->peer_release_fd = -1;
	p->buf_size = buf_size;
	p->nbufs = nbufs;
	p->cq_cap = 2 * nbufs;
	p->c = api_conn(fd, 1, &err);
	if (!p->c && !err && fstat(fd, &st) == 0) {
		p->dev = st.st_dev;
		p->ino = st.st_ino;
	}
	if (!err && p->c && atomic_exchange(&p->c->sh->pool_made, 1))
		err = EBUSY;    /* the peer maps one pool per connection */
	else if (!err && p->c)
		made = 1;
	if (!err)
		err = -pool_memory(p, len);
	if (!err)
		err = -pool_wakeups(p);
	if (!err && !p->c)
		kernel_zc_init(&p->kzc, fd, p->epfd, p->base, len, nbufs, cfg.io_uring);
	if (err) {
		if (made)       /* never handed over: the connection may have one yet */
			atomic_store(&p->c->sh->pool_made, 0);
		pool_free(p);
		api_fail(err);
		return NULL;
	}
	if (p->c)
		announce(p);
	return p;
}

EXPORT int smclo_pool_destroy(struct smclo_pool *p)
{
	if (!p)
		return api_fail(EINVAL);
	/* in a fork child too: the memory, descriptors and connection
	 * reference it frees are the child's copies */
	pool_free(p);
	return 0;
}

EXPORT int smclo_pool_fd(struct smclo_pool *p)
{
	return p ? p->epfd : api_fail(EINVAL);
}

/* ---- buffers -------------------------------------------------------------- */

/* Made by this process?  getpid() itself: smclo's cached pid is renewed at
 * fork only while smclo is active, and a pool works without it. */
static int owned(const struct smclo_pool *p)
{
	return p && p->owner == getpid();
}

/* The buffer @ptr starts, or NULL. */
static struct buf *buf_of(struct smclo_pool *p, const void *ptr)
{
	uintptr_t off = (uintptr_t)ptr - (uintptr_t)p->base;

	if ((uintptr_t)ptr < (uintptr_t)p->base || off % p->buf_size ||
	    off / p->buf_size >= p->nbufs)
		return NULL;
	return &p->bufs[off / p->buf_size];
}

EXPORT void *smclo_pool_get(struct smclo_pool *p)
{
	void *ptr = NULL;

	if (!owned(p)) {
		api_fail(p ? EPERM : EINVAL);
		return NULL;
	}
	pthread_mutex_lock(&p->lock);
	if (p->c)
		announce(p);    /* if the creation could not: a send is coming */
	for (unsigned i = 0; i < p->nbufs; i++)
		if (p->bufs[i].state == BUF_FREE) {
			p->bufs[i].state = BUF_APP;
			ptr = p->base + (size_t)i * p->buf_size;
			break;
		}
	pthread_mutex_unlock(&p->lock);
	if (!ptr)
		api_fail(ENOBUFS);
	return ptr;
}

EXPORT int smclo_pool_put(struct smclo_pool *p, void *buf)
{
	struct buf *b;
	int r = 0;

	if (!owned(p))
		return api_fail(p ? EPERM : EINVAL);
	pthread_mutex_lock(&p->lock);
	if ((b = buf_of(p, buf)) && b->state == BUF_APP)
		b->state = BUF_FREE;
	else
		r = api_fail(EINVAL);
	pthread_mutex_unlock(&p->lock);
	return r;
}

/* ---- sending -------------------------------------------------------------- */

/* May a send go by reference: the peer mapped the pool we handed over? */
static int by_reference(struct smclo_pool *p)
{
	if (!p->c)
		return 0;
	announce(p);
	return p->announced &&
	       atomic_load_explicit(&p->c->rx->pool_ack, memory_order_acquire) == 1;
}

/* The bytes by reference: the stream position that releases them, or -errno. */
static long long send_ref(struct smclo_pool *p, const struct buf *b, size_t len, int dontwait)
{
	uint32_t off = (uint32_t)((size_t)(b - p->bufs) * p->buf_size);
	long long end;

	/* its release wakes us: asked before the reference is published
	 * (whose release store orders it), so the peer sees the request */
	atomic_store_explicit(&p->c->tx->pool_wake_wanted, 1, memory_order_relaxed);
	end = tx_send_ref(p->c, p->fd, off, (uint32_t)len, dontwait);

	return end == 0 ? -EAGAIN : end;
}

/* The bytes by copy, into the ring or the socket: the count or -errno. */
static ssize_t send_copy(struct smclo_pool *p, const void *buf, size_t len, int dontwait)
{
	struct iovec v = { (void *)buf, len };
	ssize_t n;

	if (!p->c && !dontwait)
		return api_send_all(p->fd, buf, len, 0, NULL);
	if (p->c)
		return tx_send(p->c, p->fd, &v, 1, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
	n = sys_send(p->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	return n < 0 ? -errno : n;
}

static unsigned kernel_flags(int copied)
{
	return SMCLO_CQE_F_KERNEL | (copied ? SMCLO_CQE_F_COPIED : 0);
}

/* kernel_zc_done_fn: the kernel is done with buffer @i; one still being
 * sent is notified by smclo_pool_send after its request. */
static void kernel_sent(void *ctx, unsigned i, int copied)
{
	struct smclo_pool *p = ctx;

	if (p->bufs[i].state == BUF_SENT)
		notify(p, &p->bufs[i], kernel_flags(copied));
}

EXPORT ssize_t smclo_pool_send(struct smclo_pool *p, void *buf, size_t len,
                               unsigned long long user_data, int flags)
{
	int dontwait = flags & SMCLO_DONTWAIT, kernel = 0;
	struct buf *b;
	unsigned i;
	long long r;

	if (!owned(p))
		return api_fail(p ? EPERM : EINVAL);
	pthread_mutex_lock(&p->lock);
	b = buf_of(p, buf);
	if (!b || b->state != BUF_APP || len == 0 || len > p->buf_size ||
	    (flags & ~SMCLO_DONTWAIT)) {
		pthread_mutex_unlock(&p->lock);
		return api_fail(EINVAL);
	}
	i = (unsigned)(b - p->bufs);
	if (!api_names(p->fd, p->c, p->dev, p->ino)) {
		r = -EBADF;
	} else if (p->peer_gone) {
		r = -EPIPE;
	} else if (by_reference(p)) {
		r = send_ref(p, b, len, dontwait);
		if (r > 0) {
			b->end = (uint64_t)r;
			r = (long long)len;
		}
	} else if (kernel_zc_worth(&p->kzc, len)) {
		r = kernel_zc_send(&p->kzc, i, buf, len, dontwait, kernel_sent, p);
		kernel = p->kzc.bufs[i].sent;
		if (r == -ENOBUFS && !kernel)
			r = send_copy(p, buf, len, dontwait);   /* the kernel's pinning budget */
	} else {
		r = send_copy(p, buf, len, dontwait);
	}
	if (r > 0) {
		/* the request's completion, and a copy's notification at once */
		b->seq = p->next_seq++;
		b->user_data = user_data;
		b->state = BUF_SENT;
		cq_push(p, &(struct smclo_cqe){ .user_data = user_data, .res = r,
		                                .flags = SMCLO_CQE_F_MORE, .count = 1 }, b->seq);
		if (!b->end && !kernel)
			notify(p, b, SMCLO_CQE_F_COPIED);
		else if (kernel && !kernel_zc_left(&p->kzc, i))    /* done already */
			notify(p, b, kernel_flags(p->kzc.bufs[i].copied));
		wake(p);
	}
	pthread_mutex_unlock(&p->lock);
	return r > 0 ? (ssize_t)r : api_fail((int)-r);
}

/* ---- completions ---------------------------------------------------------- */

/* Has the peer closed or gone away (it reads none of our buffers again)? */
static int peer_finished(struct smclo_pool *p)
{
	struct conn *c = p->c;
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);

	if (pf & (RING_F_CLOSED | RING_F_ABORT))
		return 1;
	if (atomic_load(&c->sh->flags) & (SH_PEER_GONE | SH_BROKEN))
		return 1;
	/* every process of the peer's closed its end of the release socket
	 * (take_releases saw the end of file): nobody there can read a
	 * buffer of ours again - the one sign of a peer that died after both
	 * sides shut down writing, when the connection's hang-up says nothing */
	if (p->release_fd < 0)
		return 1;
	/* our descriptor's hang-up, while it still names the connection:
	 * noted for the connection too, so that its next send fails (EPIPE)
	 * instead of putting a reference into a ring nobody reads */
	if (api_names(p->fd, c, 0, 0)) {
		uint32_t hup = bell_hangup_flags(c, p->fd);

		atomic_fetch_or(&c->sh->flags, hup);
		if (hup & SH_PEER_GONE)
			return 1;
		/* both sides shut down writing: the socket's hang-up says
		 * nothing more, and would keep smclo_pool_fd() readable; the
		 * peer's releases and its close come on the release socket */
		if ((hup & SH_PEER_SHUT) && p->hup_watched &&
		    (atomic_load(&c->sh->flags) & SH_SHUT_WR)) {
			sys_epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->fd, NULL);
			p->hup_watched = 0;
		}
	}
	return 0;
}

/* Notify the sends the peer is done with: its cursor passed their
 * placeholders (in send order), or it went away. */
static void collect(struct smclo_pool *p)
{
	uint64_t cons;
	int gone = !p->peer_gone && peer_finished(p), out = 0;

	/* a wake-up for the next release, asked before the cursor is read
	 * (both seq_cst, against the peer's publish-then-take): either we
	 * see its release now, or it sees the request */
	atomic_store_explicit(&p->c->tx->pool_wake_wanted, 1, memory_order_seq_cst);
	cons = atomic_load_explicit(&p->c->rx->cons, memory_order_seq_cst);

	/* a cursor taken backwards is the peer's lie: keep the furthest */
	if ((int64_t)(cons - p->cons_seen) > 0)
		p->cons_seen = cons;
	for (;;) {
		struct buf *next = NULL;

		/* the oldest send still out */
		for (unsigned i = 0; i < p->nbufs; i++)
			if (p->bufs[i].state == BUF_SENT && (!next || p->bufs[i].seq < next->seq))
				next = &p->bufs[i];
		if (!next)
			break;
		if ((int64_t)(p->cons_seen - next->end) >= 0)
			notify(p, next, 0);
		else if (gone)
			notify(p, next, SMCLO_CQE_F_RECLAIMED);
		else {
			out = 1;
			break;
		}
	}
	if (!out)       /* nothing of ours to release: no wake-up wanted */
		atomic_store_explicit(&p->c->tx->pool_wake_wanted, 0, memory_order_relaxed);
	if (gone) {
		p->peer_gone = 1;
		/* its hang-up would keep smclo_pool_fd() readable for ever */
		if (p->hup_watched)
			sys_epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->fd, NULL);
		p->hup_watched = 0;
	}
}

EXPORT int smclo_reap(struct smclo_pool *p, struct smclo_cqe *cqes, unsigned max)
{
	uint64_t count;
	unsigned n = 0;

	if (!owned(p))
		return api_fail(p ? EPERM : EINVAL);
	if (!cqes && max)
		return api_fail(EINVAL);
	pthread_mutex_lock(&p->lock);
	/* first the wake-up, then the cursor: a release after this look
	 * leaves the descriptor readable */
	if (sys_read(p->efd, &count, sizeof(count)) < 0 && errno != EAGAIN)
		DBG("pool eventfd: %m");
	take_releases(p);
	if (p->c)
		collect(p);
	else
		kernel_zc_collect(&p->kzc, kernel_sent, p);
	while (n < max && p->cq_len) {
		struct cq_entry *e = &p->cq[p->cq_head];

		cqes[n++] = e->cqe;
		if (e->cqe.flags & SMCLO_CQE_F_NOTIF)
			for (unsigned i = 0; i < p->nbufs; i++) {
				struct buf *b = &p->bufs[i];

				if (b->state == BUF_DONE && b->seq - e->first_seq < e->cqe.count) {
					b->state = BUF_FREE;
					b->end = 0;
				}
			}
		p->cq_head = (p->cq_head + 1) % p->cq_cap;
		p->cq_len--;
	}
	if (p->cq_len)
		wake(p);        /* more than @max: stay readable */
	pthread_mutex_unlock(&p->lock);
	return (int)n;
}
