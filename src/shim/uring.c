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

#define RINGS_MAX 64
static struct lib_uring *_Atomic rings[RINGS_MAX];

static void rings_add(struct lib_uring *r)
{
	if (!smclo_active || !uring_nop_injects())
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
	for (int i = 0; i < RINGS_MAX; i++) {
		struct lib_uring *mine = r;
		if (atomic_compare_exchange_strong(&rings[i], &mine, NULL)) {
			hs_uring_seen(r->ring_fd, 0);
			return;
		}
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

/* Make @sqe a NOP that completes with @res, as the request would have
 * (its user_data, links and CQE_SKIP_SUCCESS kept). */
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

/* A read of @c (referenced), moved, whose ring still holds bytes or its
 * end: answered from the ring.  0 if the kernel should read after all. */
static int answer_read(struct io_uring_sqe *sqe, struct conn *c, int fd)
{
	struct iovec one;
	int n, flags;
	const struct iovec *iov = sqe_read_iov(sqe, &one, &n, &flags);
	ssize_t r;

	if (!iov) {
		conn_put(c);
		DBG("fd %d: io_uring read of a moved connection with bytes left in its ring, "
		    "into a buffer the kernel picks: ECONNRESET", fd);
		sqe_inject(sqe, -ECONNRESET);
		return 1;
	}
	r = shim_recv_conn(c, fd, iov, n, (flags & (MSG_PEEK | MSG_TRUNC)) | MSG_DONTWAIT);
	if (r == SHIM_MOVED)
		return 0;               /* emptied meanwhile: TCP has the rest */
	if (r >= 0 && sqe->opcode == IORING_OP_RECVMSG) {
		struct msghdr *m = (struct msghdr *)(uintptr_t)sqe->addr;
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	sqe_inject(sqe, r);
	return 1;
}

/* Does @op read from the socket in its fd field?  Unknown ones may. */
static int op_reads(int op)
{
	switch (op) {
	case IORING_OP_READ: case IORING_OP_READV: case IORING_OP_READ_FIXED:
	case IORING_OP_RECV: case IORING_OP_RECVMSG: case IORING_OP_POLL_ADD:
		return 1;
	default:
		return op >= IORING_OP_LAST;
	}
}

/* @sqe names connection @c (referenced) at @fd: it goes to TCP first. */
static void sqe_on_conn(struct io_uring_sqe *sqe, struct conn *c, int fd)
{
	if (hs_move_now(c, fd, R_IO_URING) < 0) {
		conn_put(c);
		DBG("fd %d: used through io_uring, and without TCP beneath it cannot move: "
		    "EOPNOTSUPP", fd);
		sqe_inject(sqe, -EOPNOTSUPP);
		return;
	}
	if (!op_reads(sqe->opcode) || !rx_ring_readable(c)) {
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
	answer_read(sqe, c, fd);
}

/* Calls whose descriptor smclo keeps tables of: made by smclo's wrapper. */
static int sqe_by_wrapper(struct io_uring_sqe *sqe, int fd)
{
	switch (sqe->opcode) {
	case IORING_OP_CLOSE:
		if (sqe->file_index)
			return 0;
		sqe_inject(sqe, ret_or_errno(close(fd)));
		return 1;
	case IORING_OP_ACCEPT:
		hs_listener_unserved(fd);
		return 0;
	default:
		return 0;
	}
}

static void sqe_fd(struct io_uring_sqe *sqe, int fd)
{
	struct conn *c;

	if (fd < 0 || (!fd_flags(fd) && !fd_has_conn(fd)))
		return;         /* a file, a pipe, a socket smclo never saw */
	if (sqe_by_wrapper(sqe, fd))
		return;
	hs_resolve_fd(fd);
	/* a moved connection is one for reading while its ring holds bytes */
	c = op_reads(sqe->opcode) ? shim_conn_reading(fd, 0, MSG_DONTWAIT) : shim_conn(fd);
	if (c)
		sqe_on_conn(sqe, c, fd);
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
static int sqe_splice(struct io_uring_sqe *sqe)
{
	int in = sqe->splice_fd_in;
	loff_t off_in = (loff_t)sqe->splice_off_in, off_out = (loff_t)sqe->off;
	struct conn *c;
	int left;

	if ((sqe->splice_flags & SPLICE_F_FD_IN_FIXED) || (sqe->flags & IOSQE_FIXED_FILE) ||
	    !fd_has_conn(in))
		return 0;
	hs_resolve_fd(in);
	if (!(c = shim_conn_reading(in, 0, MSG_DONTWAIT)))
		return 0;
	if (hs_move_now(c, in, R_IO_URING) < 0) {
		conn_put(c);
		sqe_inject(sqe, -EOPNOTSUPP);
		return 1;
	}
	left = rx_ring_readable(c);
	conn_put(c);
	if (left)
		sqe_inject(sqe, ret_or_errno(splice(in, off_in == -1 ? NULL : &off_in, sqe->fd,
		                                    sqe->off == (uint64_t)-1 ? NULL : &off_out,
		                                    sqe->len, sqe->splice_flags)));
	return left;
}

static void fixed_files(const int *fds, unsigned n);

/* Operations whose fd field is no descriptor to look at (a count, a
 * domain, another ring) or that touch no stream. */
static int op_without_fd(int op)
{
	switch (op) {
	case IORING_OP_NOP: case IORING_OP_TIMEOUT: case IORING_OP_TIMEOUT_REMOVE:
	case IORING_OP_LINK_TIMEOUT: case IORING_OP_ASYNC_CANCEL: case IORING_OP_POLL_REMOVE:
	case IORING_OP_PROVIDE_BUFFERS: case IORING_OP_REMOVE_BUFFERS: case IORING_OP_MSG_RING:
	case IORING_OP_SOCKET:
		return 1;
	default:
		return 0;
	}
}

static void sqe_check(struct io_uring_sqe *sqe)
{
	if (op_without_fd(sqe->opcode))
		return;
	switch (sqe->opcode) {
	case IORING_OP_EPOLL_CTL:
		if (sqe_epoll_ctl(sqe))
			return;
		break;
	case IORING_OP_SPLICE:
		if (sqe_splice(sqe))
			return;
		break;
	case IORING_OP_FILES_UPDATE:
		fixed_files((const int *)(uintptr_t)sqe->addr, sqe->len);
		return;
	default:
		break;
	}
	if (!(sqe->flags & IOSQE_FIXED_FILE))
		sqe_fd(sqe, sqe->fd);
}

/* What liburing publishes next: its own [sqe_head, sqe_tail). */
static void uring_scan(struct io_uring *ring)
{
	struct lib_uring *r = (struct lib_uring *)ring;
	unsigned mask, shift, head, tail;

	if (!smclo_active || !ring)
		return;
	mask = *r->sq.kring_mask;
	shift = (r->flags & IORING_SETUP_SQE128) ? 7 : 6;
	head = r->sq.sqe_head;
	tail = r->sq.sqe_tail;
	if (tail - head > mask + 1)
		return;         /* not a ring liburing filled */
	for (unsigned i = head; i != tail; i++)
		sqe_check((struct io_uring_sqe *)((char *)r->sq.sqes + ((size_t)(i & mask) << shift)));
}

/* Submissions a program published itself and enters raw: the kernel's
 * [head, tail), through the index array (no SQPOLL thread reads them yet). */
static void uring_scan_published(int fd)
{
	struct lib_uring *r = smclo_active ? rings_by_fd(fd) : NULL;
	unsigned mask, shift, head, tail;

	if (!r || (r->flags & IORING_SETUP_SQPOLL))
		return;
	mask = *r->sq.kring_mask;
	shift = (r->flags & IORING_SETUP_SQE128) ? 7 : 6;
	head = atomic_load_explicit((_Atomic unsigned *)r->sq.khead, memory_order_acquire);
	tail = *r->sq.ktail;
	if (tail - head > mask + 1)
		return;
	for (unsigned i = head; i != tail; i++) {
		unsigned idx = r->sq.array[i & mask];
		if (idx <= mask)
			sqe_check((struct io_uring_sqe *)((char *)r->sq.sqes + ((size_t)idx << shift)));
	}
}

/* ---- registered files --------------------------------------------------- */

/* A connection registered as a fixed file is read by index, where nothing
 * here looks: it goes to TCP now.  Bytes its ring still holds could not
 * reach such reads: refused (EOPNOTSUPP) rather than skipped. */
static int fixed_file_ok(int fd)
{
	struct conn *c;
	int left;

	if (fd < 0 || !fd_has_conn(fd))
		return 1;
	hs_resolve_fd(fd);
	if (!(c = shim_conn_reading(fd, 0, MSG_DONTWAIT)))
		return 1;
	left = hs_move_now(c, fd, R_IO_URING) < 0 || rx_ring_readable(c);
	conn_put(c);
	if (left)
		DBG("fd %d: registered with io_uring with bytes left in its ring, or "
		    "without TCP beneath: refused", fd);
	return !left;
}

static void fixed_files(const int *fds, unsigned n)
{
	for (unsigned i = 0; fds && smclo_active && i < n; i++)
		fixed_file_ok(fds[i]);
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

EXPORT int io_uring_submit(struct io_uring *ring)
{
	LIBURING(io_uring_submit, -ENOSYS);

	uring_scan(ring);
	return real_io_uring_submit(ring);
}

EXPORT int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
	LIBURING(io_uring_submit_and_wait, -ENOSYS);

	uring_scan(ring);
	return real_io_uring_submit_and_wait(ring, wait_nr);
}

EXPORT int io_uring_submit_and_wait_timeout(struct io_uring *ring, struct io_uring_cqe **cqe,
                                            unsigned wait_nr, struct __kernel_timespec *ts,
                                            sigset_t *sigmask)
{
	LIBURING(io_uring_submit_and_wait_timeout, -ENOSYS);

	uring_scan(ring);
	return real_io_uring_submit_and_wait_timeout(ring, cqe, wait_nr, ts, sigmask);
}

EXPORT int io_uring_submit_and_get_events(struct io_uring *ring)
{
	LIBURING(io_uring_submit_and_get_events, -ENOSYS);

	uring_scan(ring);
	return real_io_uring_submit_and_get_events(ring);
}

/* Waits with a timeout may publish what the program queued (liburing
 * before IORING_FEAT_EXT_ARG puts its timeout in the queue behind them). */
EXPORT int io_uring_wait_cqes(struct io_uring *ring, struct io_uring_cqe **cqe,
                              unsigned wait_nr, struct __kernel_timespec *ts, sigset_t *sigmask)
{
	LIBURING(io_uring_wait_cqes, -ENOSYS);

	uring_scan(ring);
	return real_io_uring_wait_cqes(ring, cqe, wait_nr, ts, sigmask);
}

EXPORT int io_uring_wait_cqe_timeout(struct io_uring *ring, struct io_uring_cqe **cqe,
                                     struct __kernel_timespec *ts)
{
	LIBURING(io_uring_wait_cqe_timeout, -ENOSYS);

	uring_scan(ring);
	return real_io_uring_wait_cqe_timeout(ring, cqe, ts);
}

EXPORT int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe,
                              unsigned submit, unsigned wait_nr, sigset_t *sigmask)
{
	LIBURING(__io_uring_get_cqe, -ENOSYS);

	if (submit)
		uring_scan(ring);
	return real___io_uring_get_cqe(ring, cqe, submit, wait_nr, sigmask);
}

EXPORT int io_uring_enter(unsigned fd, unsigned to_submit, unsigned min_complete,
                          unsigned flags, sigset_t *sig)
{
	LIBURING(io_uring_enter, -ENOSYS);

	if (to_submit)
		uring_scan_published((int)fd);
	return real_io_uring_enter(fd, to_submit, min_complete, flags, sig);
}

EXPORT int io_uring_enter2(unsigned fd, unsigned to_submit, unsigned min_complete,
                           unsigned flags, sigset_t *sig, size_t sz)
{
	LIBURING(io_uring_enter2, -ENOSYS);

	if (to_submit)
		uring_scan_published((int)fd);
	return real_io_uring_enter2(fd, to_submit, min_complete, flags, sig, sz);
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
