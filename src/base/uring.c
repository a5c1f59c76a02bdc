/*
 * uring.c - the io_uring of uring.h: set up, register, submit SEND_ZC, reap.
 *
 * Only what zero-copy sends need: one mapping of the rings (every kernel
 * with SEND_ZC has IORING_FEAT_SINGLE_MMAP), submissions issued at once
 * by io_uring_enter, completions read in order.  The ring's head and tail
 * words are shared with the kernel: loads of what the kernel writes are
 * acquires, our stores releases, as io_uring(7) prescribes.
 */
#include "uring.h"

#include <stdatomic.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static int ring_setup(unsigned entries, struct io_uring_params *p)
{
	return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int ring_enter(int fd, unsigned submit, unsigned wait, unsigned flags)
{
	return (int)syscall(__NR_io_uring_enter, fd, submit, wait, flags, NULL, 0);
}

static int ring_register(int fd, unsigned op, void *arg, unsigned n)
{
	return (int)syscall(__NR_io_uring_register, fd, op, arg, n);
}

/* Does this kernel's io_uring know SEND_ZC?  (It refuses unknown
 * operations only at completion, too late to choose another way.) */
static int has_send_zc(int fd)
{
	size_t len = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
	struct io_uring_probe *pr = calloc(1, len);
	int ok;

	if (!pr)
		return 0;
	ok = ring_register(fd, IORING_REGISTER_PROBE, pr, 256) == 0 &&
	     pr->last_op >= IORING_OP_SEND_ZC &&
	     (pr->ops[IORING_OP_SEND_ZC].flags & IO_URING_OP_SUPPORTED);
	free(pr);
	return ok;
}

static int ring_map(struct uring *u, const struct io_uring_params *p)
{
	char *sq, *cq;

	u->sq_len = p->sq_off.array + p->sq_entries * sizeof(unsigned);
	u->cq_len = p->cq_off.cqes + p->cq_entries * sizeof(struct io_uring_cqe);
	if (u->cq_len > u->sq_len)
		u->sq_len = u->cq_len;  /* one mapping holds both */
	u->sq_map = mmap(NULL, u->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
	                 u->fd, IORING_OFF_SQ_RING);
	if (u->sq_map == MAP_FAILED) {
		u->sq_map = NULL;
		return -ENOMEM;
	}
	u->cq_map = u->sq_map;
	u->sqes_len = p->sq_entries * sizeof(struct io_uring_sqe);
	u->sqes = mmap(NULL, u->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
	               u->fd, IORING_OFF_SQES);
	if (u->sqes == MAP_FAILED) {
		u->sqes = NULL;
		return -ENOMEM;
	}
	sq = u->sq_map;
	cq = u->cq_map;
	u->sq_head = (unsigned *)(sq + p->sq_off.head);
	u->sq_tail = (unsigned *)(sq + p->sq_off.tail);
	u->sq_mask = (unsigned *)(sq + p->sq_off.ring_mask);
	u->sq_flags = (unsigned *)(sq + p->sq_off.flags);
	u->sq_array = (unsigned *)(sq + p->sq_off.array);
	u->cq_head = (unsigned *)(cq + p->cq_off.head);
	u->cq_tail = (unsigned *)(cq + p->cq_off.tail);
	u->cq_mask = (unsigned *)(cq + p->cq_off.ring_mask);
	u->cqes = cq + p->cq_off.cqes;
	return 0;
}

int uring_open(struct uring *u, unsigned entries, void *base, size_t len)
{
	struct io_uring_params p;
	struct iovec v = { base, len };
	int r;

	memset(u, 0, sizeof(*u));
	memset(&p, 0, sizeof(p));
	u->fd = ring_setup(entries, &p);
	if (u->fd < 0) {
		u->fd = -1;
		return -errno;
	}
	if (!(p.features & IORING_FEAT_SINGLE_MMAP) || !has_send_zc(u->fd)) {
		uring_close(u);
		return -EOPNOTSUPP;
	}
	if ((r = ring_map(u, &p)) < 0) {
		uring_close(u);
		return r;
	}
	/* pinned once here, or by the kernel at each send: the memory lock
	 * limit of an unprivileged user may not cover a large pool */
	u->fixed = base && ring_register(u->fd, IORING_REGISTER_BUFFERS, &v, 1) == 0;
	return 0;
}

void uring_close(struct uring *u)
{
	if (u->sqes)
		munmap(u->sqes, u->sqes_len);
	if (u->sq_map)
		munmap(u->sq_map, u->sq_len);
	if (u->fd >= 0)
		close(u->fd);
	memset(u, 0, sizeof(*u));
	u->fd = -1;
}

int uring_send_zc(struct uring *u, int fd, const void *buf, size_t len, int msg_flags,
                  uint64_t user_data)
{
	unsigned tail = *u->sq_tail, head = __atomic_load_n(u->sq_head, __ATOMIC_ACQUIRE);
	unsigned idx = tail & *u->sq_mask;
	struct io_uring_sqe *sqe = (struct io_uring_sqe *)u->sqes + idx;
	int r;

	if (tail - head > *u->sq_mask)
		return -EBUSY;          /* cannot happen: each submission is entered at once */
	if (len > UINT32_MAX)
		return -EINVAL;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_SEND_ZC;
	sqe->fd = fd;
	sqe->addr = (uint64_t)(uintptr_t)buf;
	sqe->len = (uint32_t)len;
	sqe->msg_flags = (uint32_t)msg_flags;
	sqe->ioprio = IORING_SEND_ZC_REPORT_USAGE | (u->fixed ? IORING_RECVSEND_FIXED_BUF : 0);
	sqe->buf_index = 0;
	sqe->user_data = user_data;
	u->sq_array[idx] = idx;
	__atomic_store_n(u->sq_tail, tail + 1, __ATOMIC_RELEASE);
	do
		r = ring_enter(u->fd, 1, 0, 0);
	while (r < 0 && errno == EINTR);
	if (r == 1)
		return 0;
	r = r < 0 ? -errno : -EAGAIN;
	/* not taken (no SQPOLL: the kernel reads submissions only in
	 * io_uring_enter): withdrawn, so that it never goes later */
	if (__atomic_load_n(u->sq_head, __ATOMIC_ACQUIRE) == tail)
		__atomic_store_n(u->sq_tail, tail, __ATOMIC_RELEASE);
	return r;
}

int uring_next(struct uring *u, struct uring_cqe *out)
{
	unsigned head = *u->cq_head;
	const struct io_uring_cqe *cqe;

	if (head == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE)) {
		/* completions the full queue could not take wait in the kernel */
		if (!(__atomic_load_n(u->sq_flags, __ATOMIC_RELAXED) & IORING_SQ_CQ_OVERFLOW) ||
		    ring_enter(u->fd, 0, 0, IORING_ENTER_GETEVENTS) < 0 ||
		    head == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE))
			return 0;
	}
	cqe = (const struct io_uring_cqe *)u->cqes + (head & *u->cq_mask);
	out->user_data = cqe->user_data;
	out->res = cqe->res;
	out->flags = cqe->flags;
	__atomic_store_n(u->cq_head, head + 1, __ATOMIC_RELEASE);
	return 1;
}

int uring_wait(struct uring *u)
{
	return ring_enter(u->fd, 0, 1, IORING_ENTER_GETEVENTS) < 0 ? -errno : 0;
}

/* ---- NOP with a result of our choosing --------------------------------- */

#define NOP_INJECT_RESULT 1u    /* IORING_NOP_INJECT_RESULT, in the rw_flags word */
#define NOP_PROBE_RESULT 4093   /* a result no plain NOP gives */

static int nop_probe(void)
{
	struct io_uring_params p;
	struct uring u;
	struct uring_cqe cqe;
	struct io_uring_sqe *sqe;
	int ok = 0;

	memset(&u, 0, sizeof(u));
	memset(&p, 0, sizeof(p));
	u.fd = ring_setup(2, &p);
	if (u.fd < 0)
		return 0;
	if (!(p.features & IORING_FEAT_SINGLE_MMAP) || ring_map(&u, &p) < 0)
		goto out;
	sqe = (struct io_uring_sqe *)u.sqes;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_NOP;
	sqe->fd = -1;
	sqe->rw_flags = NOP_INJECT_RESULT;
	sqe->len = NOP_PROBE_RESULT;
	u.sq_array[0] = 0;
	__atomic_store_n(u.sq_tail, *u.sq_tail + 1, __ATOMIC_RELEASE);
	if (ring_enter(u.fd, 1, 1, IORING_ENTER_GETEVENTS) == 1 && uring_next(&u, &cqe))
		ok = cqe.res == NOP_PROBE_RESULT;
out:
	uring_close(&u);
	return ok;
}

int uring_nop_injects(void)
{
	static _Atomic int known = -1;
	int k = atomic_load(&known);

	if (k < 0) {
		k = nop_probe();
		atomic_store(&known, k);
	}
	return k;
}

