/*
 * uring.c - io_uring through liburing: a process that uses io_uring for
 * its files (MariaDB's InnoDB) is accelerated, and a connection used
 * through io_uring goes to TCP before the kernel reads the submission.
 *
 * Why here: io_uring's submissions are memory the kernel reads at
 * io_uring_enter(), which liburing makes itself (no libc), so no wrapper of
 * a socket call ever sees them.  But every program that does not write its
 * own io_uring calls liburing's exported functions to publish and submit,
 * and those can be interposed as libc's are.  Before the real one runs,
 * each submission liburing is about to publish is looked at (uring_scan):
 *
 *  - one that names a connection moves it to TCP first (core/move.c,
 *    reason io-uring), and this process follows at once: the descriptor is
 *    the TCP socket when the kernel resolves it;
 *  - bytes the peer had put in the ring before the move are not in the TCP
 *    socket, so a read submitted then is answered from the ring: the
 *    submission becomes a NOP that completes with the read's result
 *    (IORING_NOP_INJECT_RESULT, Linux 6.10), the bytes already in the
 *    program's buffer.  A read that cannot be answered so (a provided
 *    buffer, multishot) completes with ECONNRESET: a visible end, never a
 *    stream with a hole in it;
 *  - a close, an epoll_ctl or a splice of a descriptor smclo knows is made
 *    by smclo's own wrapper (its tables stay true), its result injected;
 *  - an accept on a listener marks it for TCP (the handshake is answered
 *    by accept(), which io_uring bypasses).
 *
 * Rings made any other way are not seen; proof.c finds them and the
 * process declines every connection, as before (docs/design.md §5b).
 * The struct io_uring that liburing's functions take is its ABI (stable
 * across liburing 2.x); only the submission queue's fields are read, and
 * tests/unit/test_uring_abi.c checks them against liburing.h.
 */
#include "shim.h"

#include "iov.h"
#include "log.h"
#include "uring.h"
#include "uring_abi.h"

#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>

#define NOP_INJECT_RESULT 1u    /* IORING_NOP_INJECT_RESULT (base/uring.c) */

/* liburing's definition, or @fail where the program has none loaded. */
#define LIBURING(name, fail)     \
	REAL(name);              \
	if (!real_##name)        \
		return fail

/* ---- rings we watch ------------------------------------------------------ */

/* liburing's init calls its own init_params, which calls queue_mmap,
 * through its PLT: each stands in front of the next, so a ring is added
 * once, however many of them see it. */
#define RINGS_MAX 64
static struct lib_uring *_Atomic rings[RINGS_MAX];

static int rings_slot(const struct lib_uring *r)
{
	for (int i = 0; i < RINGS_MAX; i++)
		if (atomic_load(&rings[i]) == r)
			return i;
	return -1;
}

static void rings_add(struct lib_uring *r)
{
	if (!smclo_active || !uring_nop_injects() || rings_slot(r) >= 0)
		return;         /* not known: the process declines (proof.c) */
	for (int i = 0; i < RINGS_MAX; i++) {
		struct lib_uring *none = NULL;
		if (atomic_compare_exchange_strong(&rings[i], &none, r)) {
			if (hs_uring_seen(r->ring_fd, 1) < 0)
				atomic_store(&rings[i], NULL);
			return;
		}
	}
}

static void rings_del(struct lib_uring *r)
{
	int i = rings_slot(r);

	if (i >= 0) {
		hs_uring_seen(r->ring_fd, 0);
		atomic_store(&rings[i], NULL);
	}
}

static struct lib_uring *rings_by_fd(int fd)
{
	for (int i = 0; i < RINGS_MAX; i++) {
		struct lib_uring *r = atomic_load(&rings[i]);
		if (r && r->ring_fd == fd)
			return r;
	}
	return NULL;
}

/* ---- a submission answered by smclo ------------------------------------- */

/*
 * One scan: the submissions about to be published, in order.  @linked:
 * the one before had IOSQE_IO_LINK, so whether this one runs is decided in
 * the kernel, after us.  Closes of descriptors smclo keeps tables of are
 * forgotten once the real call has handed them to the kernel (@forget),
 * which closes them in their turn.
 */
#define FORGET_MAX 32
struct scan {
	int linked;
	int cancel;             /* an answer from here was short: the next one in its
	                           chain is cancelled, as the kernel would */
	int forget[FORGET_MAX];
	int nforget;
};

/* Make @sqe a NOP that completes with @res, as the request would have
 * (its user_data, links and CQE_SKIP_SUCCESS kept; a negative @res fails
 * its link as the request's failure would). */
static void sqe_inject(struct io_uring_sqe *sqe, long res)
{
	uint64_t user_data = sqe->user_data;
	uint16_t personality = sqe->personality;
	uint8_t keep = sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK | IOSQE_IO_DRAIN |
	                             IOSQE_ASYNC | IOSQE_CQE_SKIP_SUCCESS);

	if (res > INT32_MAX)
		res = INT32_MAX;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_NOP;
	sqe->flags = keep;
	sqe->fd = -1;
	sqe->rw_flags = NOP_INJECT_RESULT;
	sqe->len = (uint32_t)(int32_t)res;
	sqe->user_data = user_data;
	sqe->personality = personality;
}

static long ret_or_errno(long r)
{
	return r < 0 ? -errno : r;
}

/* Receive flags a read from the ring answers as TCP would; others (urgent
 * data, the error queue) take nothing from the stream: the kernel's. */
#define RING_FLAGS (MSG_PEEK | MSG_DONTWAIT | MSG_WAITALL | MSG_NOSIGNAL | MSG_CMSG_CLOEXEC)

/* The buffer a plain read names, or NULL for one the kernel would pick
 * (a provided buffer) or that keeps going (multishot). */
static const struct iovec *sqe_read_iov(const struct io_uring_sqe *sqe, struct iovec *one,
                                        int *n, int *flags)
{
	struct msghdr *m;

	*n = 1;
	*flags = 0;
	if (sqe->flags & IOSQE_BUFFER_SELECT)
		return NULL;
	switch (sqe->opcode) {
	case IORING_OP_RECV:
		if (sqe->ioprio & IORING_RECV_MULTISHOT)
			return NULL;
		*flags = (int)sqe->msg_flags;
		/* fallthrough */
	case IORING_OP_READ:
	case IORING_OP_READ_FIXED:
		one->iov_base = (void *)(uintptr_t)sqe->addr;
		one->iov_len = sqe->len;
		return one;
	case IORING_OP_READV:
		*n = (int)sqe->len;
		return (const struct iovec *)(uintptr_t)sqe->addr;
	case IORING_OP_RECVMSG:
		if (sqe->ioprio & IORING_RECV_MULTISHOT)
			return NULL;
		m = (struct msghdr *)(uintptr_t)sqe->addr;
		*flags = (int)sqe->msg_flags;
		*n = (int)m->msg_iovlen;
		return m->msg_iov;
	default:
		return NULL;
	}
}

/* Does a short answer to @sqe fail its link in the kernel?  A short read
 * or readv does, as a short MSG_WAITALL receive does; a hard link goes on. */
static int short_fails_link(const struct io_uring_sqe *sqe, int flags)
{
	int receive = sqe->opcode == IORING_OP_RECV || sqe->opcode == IORING_OP_RECVMSG;

	return (sqe->flags & IOSQE_IO_LINK) && !(sqe->flags & IOSQE_IO_HARDLINK) &&
	       (!receive || (flags & MSG_WAITALL));
}

/*
 * A read of @c (referenced), moved, whose ring still holds bytes or its
 * end: answered from the ring, or - where an answer now could differ from
 * the kernel's later one - refused with ECONNRESET, its bytes left in the
 * ring for the program's next read.  Returns 0 if the kernel should read
 * after all (the flags take nothing from the stream).
 */
static int answer_read(struct io_uring_sqe *sqe, struct conn *c, int fd, struct scan *sc)
{
	struct iovec one;
	int n, flags;
	const struct iovec *iov = sqe_read_iov(sqe, &one, &n, &flags);
	ssize_t r;

	if (iov && (flags & ~RING_FLAGS)) {
		conn_put(c);
		return 0;               /* MSG_OOB, MSG_ERRQUEUE: the kernel's answer */
	}
	if (!iov && !rx_has_unread(c)) {
		conn_put(c);            /* only the end is left: a read of it gets 0 */
		sqe_inject(sqe, 0);
		return 1;
	}
	/* the kernel decides whether one linked to an earlier one runs */
	if (!iov || sc->linked) {
		conn_put(c);
		DBG("fd %d: io_uring read of a moved connection with bytes left in its ring, "
		    "into a buffer the kernel picks or in a chain: ECONNRESET", fd);
		sqe_inject(sqe, -ECONNRESET);
		return 1;
	}
	r = shim_recv_conn(c, fd, iov, n, flags | MSG_DONTWAIT);
	if (r == SHIM_MOVED)
		return 0;               /* emptied meanwhile: TCP has the rest */
	/* short: the kernel would fail the link, and cancel the next one */
	sc->cancel = r >= 0 && (size_t)r < iov_total(iov, n) && short_fails_link(sqe, flags);
	if (r >= 0 && sqe->opcode == IORING_OP_RECVMSG) {
		struct msghdr *m = (struct msghdr *)(uintptr_t)sqe->addr;
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	sqe_inject(sqe, r);
	return 1;
}

/* Operations newer than the kernel headers this is built with. */
#define OP_READ_MULTISHOT 49
#define OP_WAITID 50
#define OP_FUTEX_WAITV 53

/* Does @op read from the socket in its fd field?  Unknown ones may. */
static int op_reads(int op)
{
	switch (op) {
	case IORING_OP_READ: case IORING_OP_READV: case IORING_OP_READ_FIXED:
	case IORING_OP_RECV: case IORING_OP_RECVMSG: case IORING_OP_POLL_ADD:
	case OP_READ_MULTISHOT:
		return 1;
	default:
		return op > OP_FUTEX_WAITV;
	}
}

/* Operations whose fd field is no descriptor to look at (a count, a
 * domain, flags, another ring, a pid) or that touch no stream. */
static int op_without_fd(int op)
{
	switch (op) {
	case IORING_OP_NOP: case IORING_OP_TIMEOUT: case IORING_OP_TIMEOUT_REMOVE:
	case IORING_OP_LINK_TIMEOUT: case IORING_OP_ASYNC_CANCEL: case IORING_OP_POLL_REMOVE:
	case IORING_OP_PROVIDE_BUFFERS: case IORING_OP_REMOVE_BUFFERS: case IORING_OP_MSG_RING:
	case IORING_OP_SOCKET: case IORING_OP_GETXATTR: case IORING_OP_SETXATTR:
		return 1;
	default:
		return op >= OP_WAITID && op <= OP_FUTEX_WAITV;   /* waitid, futexes */
	}
}

/*
 * The connection @fd names, moved to TCP before io_uring uses it: 1 with
 * *@c referenced, 0 if there is none (or it moved and its ring is empty,
 * for @reading), -1 if it cannot move (no TCP beneath).
 */
static int conn_to_tcp(int fd, int reading, struct conn **c)
{
	hs_resolve_fd(fd);
	/* a moved connection is one for reading while its ring holds bytes */
	*c = reading ? shim_conn_reading(fd, 0, MSG_DONTWAIT) : shim_conn(fd);
	if (!*c)
		return 0;
	if (hs_move_now(*c, R_IO_URING) == 0)
		return 1;
	conn_put(*c);
	*c = NULL;
	DBG("fd %d: used through io_uring, and without TCP beneath it cannot move", fd);
	return -1;
}

/* @sqe names connection @c (referenced, moved) at @fd. */
static void sqe_on_conn(struct io_uring_sqe *sqe, struct conn *c, int fd, struct scan *sc)
{
	if (!op_reads(sqe->opcode) || !rx_ring_holds(c)) {
		conn_put(c);
		return;         /* the TCP socket carries everything it will see */
	}
	if (sqe->opcode == IORING_OP_POLL_ADD) {
		unsigned ready = sqe->poll32_events & (POLLIN | POLLRDNORM);
		conn_put(c);
		if (ready)
			sqe_inject(sqe, ready);
		return;
	}
	answer_read(sqe, c, fd, sc);
}

/*
 * A close of a descriptor smclo keeps tables of: the kernel closes it in
 * its turn (after what the batch does before it), and smclo forgets it
 * once the submission is the kernel's.  A connection goes to TCP first,
 * so that whatever runs on the number meanwhile runs on the TCP socket;
 * one that cannot move (direct) is closed now, by smclo's close().
 */
static void sqe_close(struct io_uring_sqe *sqe, int fd, struct scan *sc)
{
	struct conn *c;

	if (sqe->file_index)
		return;         /* a fixed file's slot, not a descriptor */
	hs_resolve_fd(fd);
	if (fd_has_conn(fd) && (c = fd_get_conn(fd))) {
		int stays = c->mode == MODE_SHM && hs_move_now(c, R_IO_URING) < 0;
		conn_put(c);
		if (stays) {
			sqe_inject(sqe, ret_or_errno(close(fd)));
			return;
		}
	}
	if (sc->nforget < FORGET_MAX)
		sc->forget[sc->nforget++] = fd;
	else
		sqe_inject(sqe, ret_or_errno(close(fd)));
}

static void sqe_fd(struct io_uring_sqe *sqe, int fd, struct scan *sc)
{
	struct conn *c;

	if (fd < 0 || (!fd_flags(fd) && !fd_has_conn(fd)))
		return;         /* a file, a pipe, a socket smclo never saw */
	if (sqe->opcode == IORING_OP_CLOSE) {
		sqe_close(sqe, fd, sc);
		return;
	}
	if (sqe->opcode == IORING_OP_ACCEPT)
		hs_listener_unserved(fd);
	switch (conn_to_tcp(fd, op_reads(sqe->opcode), &c)) {
	case 1:
		sqe_on_conn(sqe, c, fd, sc);
		break;
	case -1:
		sqe_inject(sqe, -EOPNOTSUPP);
		break;
	default:
		break;
	}
}

/* IORING_OP_EPOLL_CTL on a connection: smclo's epoll_ctl watches the rings. */
static int sqe_epoll_ctl(struct io_uring_sqe *sqe)
{
	int target = (int)sqe->off;
	struct epoll_event *ev = (struct epoll_event *)(uintptr_t)sqe->addr;

	if (sqe->flags & IOSQE_FIXED_FILE || !fd_has_conn(target))
		return 0;
	sqe_inject(sqe, ret_or_errno(epoll_ctl(sqe->fd, (int)sqe->len, target, ev)));
	return 1;
}

/* A splice out of a connection: moved first; what its ring still holds is
 * read by smclo's splice (which reads rings), the rest by the kernel. */
static int sqe_splice(struct io_uring_sqe *sqe, const struct scan *sc)
{
	int in = sqe->splice_fd_in;
	loff_t off_in = (loff_t)sqe->splice_off_in, off_out = (loff_t)sqe->off;
	struct conn *c;
	int left;

	if ((sqe->splice_flags & SPLICE_F_FD_IN_FIXED) || (sqe->flags & IOSQE_FIXED_FILE) ||
	    !fd_has_conn(in) || !(left = conn_to_tcp(in, 1, &c)))
		return 0;
	if (left < 0) {
		sqe_inject(sqe, -EOPNOTSUPP);
		return 1;
	}
	left = rx_ring_holds(c);
	conn_put(c);
	if (left && (sc->linked || (sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK))))
		sqe_inject(sqe, -ECONNRESET);   /* as answer_read: the kernel decides links */
	else if (left)
		sqe_inject(sqe, ret_or_errno(splice(in, off_in == -1 ? NULL : &off_in, sqe->fd,
		                                    sqe->off == (uint64_t)-1 ? NULL : &off_out,
		                                    sqe->len, sqe->splice_flags)));
	return left;
}

static int fixed_files_ok(const int *fds, unsigned n);

static void sqe_check(struct io_uring_sqe *sqe, struct scan *sc)
{
	if (op_without_fd(sqe->opcode))
		return;
	switch (sqe->opcode) {
	case IORING_OP_EPOLL_CTL:
		if (sqe_epoll_ctl(sqe))
			return;
		break;
	case IORING_OP_SPLICE:
		if (sqe_splice(sqe, sc))
			return;
		break;
	case IORING_OP_FILES_UPDATE:
		if (!fixed_files_ok((const int *)(uintptr_t)sqe->addr, sqe->len))
			sqe_inject(sqe, -EOPNOTSUPP);
		return;
	default:
		break;
	}
	if (!(sqe->flags & IOSQE_FIXED_FILE))
		sqe_fd(sqe, sqe->fd, sc);
}

static struct io_uring_sqe *sqe_at(const struct lib_uring *r, unsigned idx)
{
	unsigned shift = (r->flags & IORING_SETUP_SQE128) ? 7 : 6;

	return (struct io_uring_sqe *)((char *)r->sq.sqes + ((size_t)idx << shift));
}

static void scan_one(struct io_uring_sqe *sqe, struct scan *sc)
{
	uint8_t links = sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK);

	if (sc->cancel) {
		sc->cancel = 0;
		sqe_inject(sqe, -ECANCELED);    /* failing, it cancels the rest */
	} else {
		sqe_check(sqe, sc);
	}
	sc->linked = links != 0;
}

/* What liburing publishes next: its own [sqe_head, sqe_tail). */
static void uring_scan(struct io_uring *ring, struct scan *sc)
{
	struct lib_uring *r = (struct lib_uring *)ring;
	unsigned mask, head, tail;

	sc->linked = 0;
	sc->cancel = 0;
	sc->nforget = 0;
	if (!smclo_active || !ring)
		return;
	mask = *r->sq.kring_mask;
	head = r->sq.sqe_head;
	tail = r->sq.sqe_tail;
	if (tail - head > mask + 1)
		return;         /* not a ring liburing filled */
	for (unsigned i = head; i != tail; i++)
		scan_one(sqe_at(r, i & mask), sc);
}

/* Submissions a program published itself and enters raw: the kernel's
 * [head, tail), through the index array if the ring has one (no SQPOLL
 * thread reads them yet). */
static void uring_scan_published(int fd, struct scan *sc)
{
	struct lib_uring *r = smclo_active ? rings_by_fd(fd) : NULL;
	unsigned mask, head, tail;

	sc->linked = 0;
	sc->cancel = 0;
	sc->nforget = 0;
	if (!r || (r->flags & IORING_SETUP_SQPOLL))
		return;
	mask = *r->sq.kring_mask;
	head = atomic_load_explicit((_Atomic unsigned *)r->sq.khead, memory_order_acquire);
	tail = *r->sq.ktail;
	if (tail - head > mask + 1)
		return;
	for (unsigned i = head; i != tail; i++) {
		unsigned idx = r->sq.array ? r->sq.array[i & mask] : i & mask;
		if (idx <= mask)
			scan_one(sqe_at(r, idx), sc);
	}
}

/* The real call has handed the batch to the kernel: what it closes is
 * forgotten now (its number names the TCP socket, or nothing, meanwhile). */
static void uring_after(struct scan *sc)
{
	for (int i = 0; i < sc->nforget; i++)
		shim_forget_fd(sc->forget[i]);
	sc->nforget = 0;
}

/* Would a wait with a timeout publish what the program queued?  Only
 * liburing's way for kernels without IORING_FEAT_EXT_ARG (a timeout put
 * in the queue behind them). */
static int waits_submit(const struct io_uring *ring)
{
	return ring && !(((const struct lib_uring *)ring)->features & IORING_FEAT_EXT_ARG);
}

/* ---- registered files --------------------------------------------------- */

/* A connection registered as a fixed file is read by index, where nothing
 * here looks: it goes to TCP now.  Bytes its ring still holds could not
 * reach such reads: refused (EOPNOTSUPP) rather than skipped.  A listener
 * accepts there without accept() (clients take TCP at once). */
static int fixed_file_ok(int fd)
{
	struct conn *c;
	int left;

	if (fd >= 0 && (fd_flags(fd) & FDF_LISTENING))
		hs_listener_unserved(fd);
	if (fd < 0 || !fd_has_conn(fd) || !(left = conn_to_tcp(fd, 1, &c)))
		return 1;
	if (left > 0) {
		left = rx_ring_holds(c);
		conn_put(c);
	}
	if (left)
		DBG("fd %d: registered with io_uring with bytes left in its ring, or "
		    "without TCP beneath: refused", fd);
	return !left;
}

static int fixed_files_ok(const int *fds, unsigned n)
{
	int ok = 1;

	for (unsigned i = 0; fds && smclo_active && i < n; i++)
		ok &= fixed_file_ok(fds[i]);
	return ok;
}

/* ---- liburing's functions ------------------------------------------------ */

EXPORT int io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p)
{
	LIBURING(io_uring_queue_init_params, -ENOSYS);
	int r = real_io_uring_queue_init_params(entries, ring, p);

	if (r == 0)
		rings_add((struct lib_uring *)ring);
	return r;
}

EXPORT int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
	LIBURING(io_uring_queue_init, -ENOSYS);
	int r = real_io_uring_queue_init(entries, ring, flags);

	if (r == 0)
		rings_add((struct lib_uring *)ring);
	return r;
}

EXPORT int io_uring_queue_mmap(int fd, struct io_uring_params *p, struct io_uring *ring)
{
	LIBURING(io_uring_queue_mmap, -ENOSYS);
	int r = real_io_uring_queue_mmap(fd, p, ring);

	if (r == 0)
		rings_add((struct lib_uring *)ring);
	return r;
}

EXPORT void io_uring_queue_exit(struct io_uring *ring)
{
	LIBURING(io_uring_queue_exit, );

	rings_del((struct lib_uring *)ring);
	real_io_uring_queue_exit(ring);
}

/* Scan, make the real call, and forget what it handed the kernel to close. */
#define SCANNED(scan_call, real_call)            \
	do {                                     \
		struct scan sc_;                 \
		int r_;                          \
		scan_call;                       \
		r_ = real_call;                  \
		uring_after(&sc_);               \
		return r_;                       \
	} while (0)

EXPORT int io_uring_submit(struct io_uring *ring)
{
	LIBURING(io_uring_submit, -ENOSYS);

	SCANNED(uring_scan(ring, &sc_), real_io_uring_submit(ring));
}

EXPORT int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
	LIBURING(io_uring_submit_and_wait, -ENOSYS);

	SCANNED(uring_scan(ring, &sc_), real_io_uring_submit_and_wait(ring, wait_nr));
}

EXPORT int io_uring_submit_and_wait_timeout(struct io_uring *ring, struct io_uring_cqe **cqe,
                                            unsigned wait_nr, struct __kernel_timespec *ts,
                                            sigset_t *sigmask)
{
	LIBURING(io_uring_submit_and_wait_timeout, -ENOSYS);

	SCANNED(uring_scan(ring, &sc_), real_io_uring_submit_and_wait_timeout(ring, cqe, wait_nr, ts, sigmask));
}

EXPORT int io_uring_submit_and_get_events(struct io_uring *ring)
{
	LIBURING(io_uring_submit_and_get_events, -ENOSYS);

	SCANNED(uring_scan(ring, &sc_), real_io_uring_submit_and_get_events(ring));
}

/* Waits with a timeout publish what the program queued only where
 * liburing puts its timeout in the queue behind them (waits_submit). */
EXPORT int io_uring_wait_cqes(struct io_uring *ring, struct io_uring_cqe **cqe,
                              unsigned wait_nr, struct __kernel_timespec *ts, sigset_t *sigmask)
{
	LIBURING(io_uring_wait_cqes, -ENOSYS);

	if (!ts || !waits_submit(ring))
		return real_io_uring_wait_cqes(ring, cqe, wait_nr, ts, sigmask);
	SCANNED(uring_scan(ring, &sc_), real_io_uring_wait_cqes(ring, cqe, wait_nr, ts, sigmask));
}

EXPORT int io_uring_wait_cqe_timeout(struct io_uring *ring, struct io_uring_cqe **cqe,
                                     struct __kernel_timespec *ts)
{
	LIBURING(io_uring_wait_cqe_timeout, -ENOSYS);

	if (!ts || !waits_submit(ring))
		return real_io_uring_wait_cqe_timeout(ring, cqe, ts);
	SCANNED(uring_scan(ring, &sc_), real_io_uring_wait_cqe_timeout(ring, cqe, ts));
}

EXPORT int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe,
                              unsigned submit, unsigned wait_nr, sigset_t *sigmask)
{
	LIBURING(__io_uring_get_cqe, -ENOSYS);

	if (!submit)
		return real___io_uring_get_cqe(ring, cqe, submit, wait_nr, sigmask);
	SCANNED(uring_scan(ring, &sc_), real___io_uring_get_cqe(ring, cqe, submit, wait_nr, sigmask));
}

EXPORT int io_uring_enter(unsigned fd, unsigned to_submit, unsigned min_complete,
                          unsigned flags, sigset_t *sig)
{
	LIBURING(io_uring_enter, -ENOSYS);

	if (!to_submit)
		return real_io_uring_enter(fd, to_submit, min_complete, flags, sig);
	SCANNED(uring_scan_published((int)fd, &sc_), real_io_uring_enter(fd, to_submit, min_complete, flags, sig));
}

EXPORT int io_uring_enter2(unsigned fd, unsigned to_submit, unsigned min_complete,
                           unsigned flags, sigset_t *sig, size_t sz)
{
	LIBURING(io_uring_enter2, -ENOSYS);

	if (!to_submit)
		return real_io_uring_enter2(fd, to_submit, min_complete, flags, sig, sz);
	SCANNED(uring_scan_published((int)fd, &sc_), real_io_uring_enter2(fd, to_submit, min_complete, flags, sig, sz));
}

EXPORT int io_uring_register_files(struct io_uring *ring, const int *files, unsigned n)
{
	LIBURING(io_uring_register_files, -ENOSYS);

	if (!fixed_files_ok(files, n))
		return -EOPNOTSUPP;
	return real_io_uring_register_files(ring, files, n);
}

EXPORT int io_uring_register_files_tags(struct io_uring *ring, const int *files,
                                        const __u64 *tags, unsigned n)
{
	LIBURING(io_uring_register_files_tags, -ENOSYS);

	if (!fixed_files_ok(files, n))
		return -EOPNOTSUPP;
	return real_io_uring_register_files_tags(ring, files, tags, n);
}

EXPORT int io_uring_register_files_update(struct io_uring *ring, unsigned off,
                                          const int *files, unsigned n)
{
	LIBURING(io_uring_register_files_update, -ENOSYS);

	if (!fixed_files_ok(files, n))
		return -EOPNOTSUPP;
	return real_io_uring_register_files_update(ring, off, files, n);
}

EXPORT int io_uring_register_files_update_tag(struct io_uring *ring, unsigned off,
                                              const int *files, const __u64 *tags, unsigned n)
{
	LIBURING(io_uring_register_files_update_tag, -ENOSYS);

	if (!fixed_files_ok(files, n))
		return -EOPNOTSUPP;
	return real_io_uring_register_files_update_tag(ring, off, files, tags, n);
}

/* The raw register call: the descriptors of its file tables. */
static int register_arg_ok(unsigned op, const void *arg, unsigned n)
{
	const struct io_uring_rsrc_register *rr = arg;
	const struct io_uring_files_update *fu = arg;
	const struct io_uring_rsrc_update2 *u2 = arg;

	if (!arg)
		return 1;
	switch (op) {
	case IORING_REGISTER_FILES:
		return fixed_files_ok(arg, n);
	case IORING_REGISTER_FILES2:
		return fixed_files_ok((const int *)(uintptr_t)rr->data, rr->nr);
	case IORING_REGISTER_FILES_UPDATE:
		return fixed_files_ok((const int *)(uintptr_t)fu->fds, n);
	case IORING_REGISTER_FILES_UPDATE2:
		return fixed_files_ok((const int *)(uintptr_t)u2->data, u2->nr);
	default:
		return 1;
	}
}

EXPORT int io_uring_register(unsigned fd, unsigned op, const void *arg, unsigned n)
{
	LIBURING(io_uring_register, -ENOSYS);

	if (!register_arg_ok(op, arg, n))
		return -EOPNOTSUPP;
	return real_io_uring_register(fd, op, arg, n);
}
