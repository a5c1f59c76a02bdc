/*
 * uring.h - a small io_uring for one thing: zero-copy sends (IORING_OP_SEND_ZC)
 * and their two completions (docs/background.md section 3).
 *
 * The buffer pools send to a peer on another host with the kernel's zero
 * copy.  io_uring's SEND_ZC is the better of the kernel's two ways: the
 * pool's memory is registered once (its pages pinned once, not at every
 * send as MSG_ZEROCOPY pins them), and the notification that a buffer is
 * free again arrives in the completion queue, not through an error queue
 * read with a system call per batch.  System calls directly, no liburing:
 * the library is loaded into every program `smclo run` starts and brings
 * no dependency of its own.
 *
 * One thread at a time per ring (the pool's lock).
 */
#ifndef SMCLO_URING_H
#define SMCLO_URING_H

#include <stddef.h>
#include <stdint.h>

struct uring {
	int fd;                     /* -1: none */
	void *sq_map, *cq_map, *sqes;
	size_t sq_len, cq_len, sqes_len;
	unsigned *sq_head, *sq_tail, *sq_mask, *sq_flags, *sq_array;
	unsigned *cq_head, *cq_tail, *cq_mask;
	void *cqes;
	int fixed;                  /* the buffer of uring_open is registered */
};

/* One completion, as the kernel gave it. */
struct uring_cqe {
	uint64_t user_data;
	int32_t res;
	uint32_t flags;             /* IORING_CQE_F_MORE, IORING_CQE_F_NOTIF */
};

/*
 * A ring of @entries submissions whose kernel has SEND_ZC, with @base..@len
 * registered for sends without pinning (if the memory lock limit allows;
 * sends work without).  0, or -errno: io_uring absent, disabled (sysctl
 * kernel.io_uring_disabled, a container's seccomp filter) or without
 * SEND_ZC - the caller uses MSG_ZEROCOPY then.
 */
int uring_open(struct uring *u, unsigned entries, void *base, size_t len);

void uring_close(struct uring *u);

/*
 * Submit one zero-copy send of @buf (inside the registered memory, if
 * any) to socket @fd with @msg_flags, the kernel asked to say in the
 * notification whether it copied after all.  Returns 0 or -errno.
 */
int uring_send_zc(struct uring *u, int fd, const void *buf, size_t len, int msg_flags,
                  uint64_t user_data);

/* Take the next completion: 1, or 0 if none is there. */
int uring_next(struct uring *u, struct uring_cqe *out);

/* Sleep until a completion is there (a signal returns early): 0 or -errno. */
int uring_wait(struct uring *u);

/*
 * Does this kernel complete a NOP with the result its submission names
 * (IORING_NOP_INJECT_RESULT, Linux 6.10)?  Older kernels ignore the flag
 * and complete it with 0.  shim/uring.c answers a program's io_uring read
 * from a ring that way; asked once, the answer kept.
 */
int uring_nop_injects(void);

#endif
