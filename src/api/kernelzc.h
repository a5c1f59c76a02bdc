/*
 * kernelzc.h - the kernel's zero copy for a buffer pool on a TCP socket to
 * another host: io_uring's SEND_ZC where the kernel and its configuration
 * allow io_uring, else MSG_ZEROCOPY (pool.c, docs/api.md).
 *
 * Both give a buffer back only once the kernel says it no longer reads it;
 * kernel_zc_collect() turns what the kernel said into one call of @done
 * per buffer that is free again.  Called under the pool's lock.
 */
#ifndef SMCLO_KERNELZC_H
#define SMCLO_KERNELZC_H

#include "smclo.h"
#include "uring.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum kernel_zc_way {
	KZC_NONE,       /* loopback, or the socket refuses: the pool copies */
	KZC_MSG,        /* send(MSG_ZEROCOPY), notified on the error queue */
	KZC_URING,      /* io_uring SEND_ZC, notified in its completion queue */
};

struct kernel_zc_buf {
	uint64_t gen;           /* the send (io_uring: its notifications name it) */
	uint32_t first;         /* MSG_ZEROCOPY: its notification ids first.. */
	uint32_t count;         /* ..+ count - 1, one per send() that took bytes */
	uint32_t left;          /* notifications still to come */
	int copied;             /* the kernel copied after all */
	int sent;               /* the kernel took bytes of it */
};

struct kernel_zc {
	enum kernel_zc_way way;
	int fd;                 /* the socket */
	int epfd;               /* the pool's: readable when notifications wait */
	int watched;            /* MSG_ZEROCOPY: the socket is in epfd */
	uint32_t next_id;       /* MSG_ZEROCOPY: the socket's next notification id */
	uint64_t gen;
	struct uring ring;
	struct kernel_zc_buf bufs[SMCLO_POOL_BUFS_MAX];
};

/* Buffer @i is free again (@copied: the kernel copied its bytes after all). */
typedef void (*kernel_zc_done_fn)(void *ctx, unsigned i, int copied);

/*
 * Choose the way for socket @fd, whose pool @base..@len of @nbufs buffers
 * polls through @epfd: none to a loopback address (the kernel copies
 * looped-back bytes anyway), io_uring if @uring and the kernel has it,
 * else MSG_ZEROCOPY if the socket takes SO_ZEROCOPY.
 */
void kernel_zc_init(struct kernel_zc *z, int fd, int epfd, void *base, size_t len,
                    unsigned nbufs, int uring);

void kernel_zc_free(struct kernel_zc *z);

/* Is a send of @len bytes worth the kernel's zero copy? */
int kernel_zc_worth(const struct kernel_zc *z, size_t len);

/*
 * Send buffer @i's @len bytes at @buf as a send() would (all of them,
 * waiting, unless @dontwait).  Returns the count, or -errno; -ENOBUFS with
 * nothing sent means the kernel refused to pin the pages (RLIMIT_MEMLOCK of
 * a user without CAP_IPC_LOCK, optmem): copy instead.  Refused part-way,
 * the rest is copied (and the notification says SMCLO_CQE_F_COPIED).
 * Notifications seen meanwhile go to @done - for other buffers, and
 * possibly for @i itself before this returns (kernel_zc_left says).
 */
ssize_t kernel_zc_send(struct kernel_zc *z, unsigned i, const void *buf, size_t len,
                       int dontwait, kernel_zc_done_fn done, void *ctx);

/* Notifications buffer @i still waits for. */
uint32_t kernel_zc_left(const struct kernel_zc *z, unsigned i);

/* Take what the kernel notified: @done for each buffer free again. */
void kernel_zc_collect(struct kernel_zc *z, kernel_zc_done_fn done, void *ctx);

#endif
