/*
 * shim.h - what the files of the preload shim share: the lookup every
 * wrapper starts with, and the forgetting every close does.
 *
 * The shim is libc's socket calls, seen first (LD_PRELOAD, or -lsmclo).
 * Every wrapper starts with the cheapest possible test (one load from the
 * descriptor table) and hands anything that is not an accelerated
 * connection straight to libc, so plain descriptors, files and pipes pay
 * almost nothing.  The decisions live in src/handshake/, the byte moving in
 * src/core/ (tx.c, rx.c).  One file per concern: socket.c, io.c, close.c,
 * descriptors.c, process.c, epoll.c (with epoll_watch.c), poll.c (with
 * pollwait.c), exec.c, spawn.c, seccomp.c and uring.c (liburing's submit
 * functions).
 */
#ifndef SMCLO_SHIM_H
#define SMCLO_SHIM_H

#include "conn.h"
#include "fdtab.h"
#include "handshake.h"
#include "interpose.h"
#include "io.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <sys/uio.h>

/*
 * The accelerated connection behind @fd, referenced; NULL for anything
 * else.  A receiving call passes what it would read (@n, @flags): a blocking
 * read of a pending connection waits for the answer, not just the decision
 * (hs_resolve).  A plain descriptor costs the inline test only.  A
 * connection moved to TCP (core/move.c) is followed here; it is still one
 * for reading while its ring holds bytes, and for nothing else.
 */
struct conn *shim_conn_lookup(int fd, size_t n, int flags, int reading);
static inline struct conn *shim_conn_reading(int fd, size_t n, int flags)
{
	if (!smclo_active || !fd_has_conn(fd))
		return NULL;
	return shim_conn_lookup(fd, n, flags, 1);
}

static inline struct conn *shim_conn(int fd)
{
	if (!smclo_active || !fd_has_conn(fd))
		return NULL;
	return shim_conn_lookup(fd, 0, 0, 0);
}

/*
 * A read or write the core handed back (-EXDEV): the connection moved to
 * TCP meanwhile, and the program's own call goes to the kernel.
 */
#define SHIM_MOVED (-EXDEV)

/*
 * A connection of @fd moved to TCP by the peer (core/move.c) is followed
 * now: a readiness call that looks at the kernel only (a poll for POLLOUT)
 * must see the TCP socket, not the doorbell socket's hang-up.
 */
void shim_follow_moved(int fd);

/*
 * io.c: a receive from @c (its reference taken) named by @fd, as recv()
 * with @flags reads it: bytes, -errno, or SHIM_MOVED when the kernel's
 * socket answers from here on (the ring is empty after a move).
 */
ssize_t shim_recv_conn(struct conn *c, int fd, const struct iovec *iov, int n, int flags);

/* close.c: what smclo knew of @fd, forgotten as it closes (close, dup2 over it). */
void shim_forget_fd(int fd);

/*
 * The libc boundary: inside the library a failure is -errno (liburing's
 * convention); a wrapper returns -1 with errno set, as the call it stands for.
 */
static inline ssize_t shim_ret(ssize_t r)
{
	if (r >= 0)
		return r;
	errno = (int)-r;
	return -1;
}

/* A wait's timeout in ms (-1: none), as poll() takes it. */
static inline int shim_timespec_ms(const struct timespec *ts)
{
	long long ms;

	if (!ts)
		return -1;
	ms = ts->tv_sec * 1000LL + (ts->tv_nsec + 999999) / 1000000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

/*
 * seccomp.c: RLIMIT_NOFILE is about to become @soft: below a connection's
 * number, the process is confining itself, and its connections move to
 * TCP first (a dup3() onto their numbers fails after it).
 */
void seccomp_nofile_lowering(unsigned long soft);

/* spawn.c's lock of file-action lists, held across fork() (runtime/fork.c). */
void spawn_fork_lock(void);
void spawn_fork_unlock(void);

#endif
