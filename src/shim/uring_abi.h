/*
 * uring_abi.h - what shim/uring.c reads of liburing's struct io_uring, and
 * the liburing functions it stands in front of, without liburing's header:
 * the library is loaded into every program and depends on nothing.
 *
 * liburing's rings are memory it shares with the program (its inline
 * functions fill them); the layout of the submission queue's part is its
 * ABI, unchanged across liburing 2.x.  tests/unit/test_uring_abi.c checks
 * every offset here against the installed liburing.h.
 */
#ifndef SMCLO_URING_ABI_H
#define SMCLO_URING_ABI_H

#include <linux/io_uring.h>
#include <signal.h>
#include <stddef.h>

struct lib_uring_sq {
	unsigned *khead, *ktail, *kring_mask, *kring_entries, *kflags, *kdropped, *array;
	void *sqes;
	unsigned sqe_head, sqe_tail;    /* liburing's own: filled, not yet published */
	size_t ring_sz;
	void *ring_ptr;
	unsigned ring_mask, ring_entries;
	unsigned pad[2];
};

struct lib_uring_cq {
	unsigned *khead, *ktail, *kring_mask, *kring_entries, *kflags, *koverflow;
	void *cqes;
	size_t ring_sz;
	void *ring_ptr;
	unsigned ring_mask, ring_entries;
	unsigned pad[2];
};

struct lib_uring {
	struct lib_uring_sq sq;
	struct lib_uring_cq cq;
	unsigned flags;                 /* IORING_SETUP_* */
	int ring_fd;
	unsigned features;              /* IORING_FEAT_* */
};

/* liburing's functions, as it declares them (struct io_uring is opaque here). */
struct io_uring;
int io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                               struct io_uring_params *p);
int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags);
int io_uring_queue_mmap(int fd, struct io_uring_params *p, struct io_uring *ring);
void io_uring_queue_exit(struct io_uring *ring);
int io_uring_submit(struct io_uring *ring);
int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr);
int io_uring_submit_and_wait_timeout(struct io_uring *ring, struct io_uring_cqe **cqe,
                                     unsigned wait_nr, struct __kernel_timespec *ts,
                                     sigset_t *sigmask);
int io_uring_submit_and_get_events(struct io_uring *ring);
int io_uring_wait_cqes(struct io_uring *ring, struct io_uring_cqe **cqe, unsigned wait_nr,
                       struct __kernel_timespec *ts, sigset_t *sigmask);
int io_uring_wait_cqe_timeout(struct io_uring *ring, struct io_uring_cqe **cqe,
                              struct __kernel_timespec *ts);
int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe, unsigned submit,
                       unsigned wait_nr, sigset_t *sigmask);
int io_uring_enter(unsigned fd, unsigned to_submit, unsigned min_complete, unsigned flags,
                   sigset_t *sig);
int io_uring_enter2(unsigned fd, unsigned to_submit, unsigned min_complete, unsigned flags,
                    sigset_t *sig, size_t sz);
int io_uring_register_files(struct io_uring *ring, const int *files, unsigned n);
int io_uring_register_files_tags(struct io_uring *ring, const int *files, const __u64 *tags,
                                 unsigned n);
int io_uring_register_files_update(struct io_uring *ring, unsigned off, const int *files,
                                   unsigned n);
int io_uring_register_files_update_tag(struct io_uring *ring, unsigned off, const int *files,
                                       const __u64 *tags, unsigned n);
int io_uring_register(unsigned fd, unsigned op, const void *arg, unsigned n);

#endif
