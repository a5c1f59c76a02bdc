/*
 * smclo.h - smclo's native API: send and receive in place.
 *
 * smclo switches TCP connections between processes of one host to shared
 * memory (see smclo(1)).  Through read() and write() that still costs two
 * copies: the sender's buffer into the ring, the ring into the receiver's
 * buffer.  This API takes one of them away on each side:
 *
 *   - smclo_send_claim() hands out the free space of the connection's send
 *     ring itself; the program builds its message there and
 *     smclo_send_commit() publishes it (smclo_send_abort() takes it back).
 *     This is the prepare/commit/abort of the kernel's page_frag cache.
 *   - smclo_recv_peek() shows the received bytes where they lie in the
 *     peer's ring; smclo_recv_consume() releases them, which gives the
 *     sender its space back (the consumer cursor of SMC's CDC messages).
 *
 * Every call works on any connected TCP socket descriptor.  On a
 * connection smclo did not accelerate (the peer is a plain TCP program, is
 * on another host, or smclo gave the reason in `smclo stat`), the same calls
 * work on memory of the library and the socket's send() and recv(), and
 * say so: every claim and peek reports how the bytes travel (SMCLO_VIA_*).
 * A program written to this API therefore needs no second code path.
 *
 * A program linked with -lsmclo needs no `smclo run`: the library starts
 * when the program does.  Under `smclo run` the same functions are there.
 *
 * The stream: claims and commits, peeks and consumes, read(), write(),
 * send() and recv() may be mixed on one descriptor and the byte stream stays
 * in order.  Between a claim and its commit (or a peek and its consume) the
 * calling thread holds that direction of the connection: other threads'
 * sends (or receives) on it wait, and the same thread's own write() during
 * its claim, or read() during its peek, fails with EDEADLK (the other
 * direction is free: an echo can peek, claim, copy, commit and consume).
 * A claim or peek belongs to the thread that made it; a fork child does not
 * inherit it, and a thread that exits gives it up.  Closing or shutting
 * down the descriptor gives up the closing thread's own claim and peek.
 * A claim or peek and its commit or consume name the same descriptor
 * number.  While one thread holds a direction, another thread's close() or
 * shutdown() of the connection waits for the commit or consume, and its
 * calls that may not wait (SMCLO_DONTWAIT, a non-blocking descriptor) get
 * EAGAIN.  On TCP a claim or peek holds nothing of the connection: another
 * thread's send() goes before the commit's bytes, and two threads peeking
 * one descriptor must take turns themselves.
 *
 * Errors: every function returns -1 and sets errno on failure, as socket
 * calls do.  A bad argument is EINVAL, never a crash.
 *
 *   - A buffer pool (smclo_pool_create()) takes the other copy away as
 *     well, for large messages: the sender fills buffers of its pool, which
 *     the peer maps read-only, and a send passes a reference to the buffer
 *     through the ring.  The receiver reads the bytes in place (a peek says
 *     SMCLO_VIA_POOL) or with read() (a copy, as from the ring); consuming
 *     them releases the buffer.  As io_uring's zero-copy send, each send
 *     completes twice: the request, then a notification once the buffer
 *     may be written again (smclo_reap(), pollable with smclo_pool_fd()).
 *
 * Man pages: smclo_send_claim(3), smclo_recv_peek(3), smclo_pool_create(3).  The model and the
 * measured figures: docs/api.md.
 */
#ifndef SMCLO_H
#define SMCLO_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How the bytes of a claim or a peek travel. */
#define SMCLO_VIA_RING 1        /* in place, in the connection's shared ring */
#define SMCLO_VIA_COPY 2        /* through library memory and the TCP socket */
#define SMCLO_VIA_POOL 3        /* in place, in a buffer of the sender's pool */

/* Flags. */
#define SMCLO_DONTWAIT 0x1      /* never wait: EAGAIN instead (the probe form) */
#define SMCLO_KEEP     0x2      /* commit: publish, and keep the rest of the claim */

/* A run of bytes in place: two pieces where a ring wraps, else iov[1] is empty. */
struct smclo_span {
	struct iovec iov[2];
	size_t len;             /* iov[0].iov_len + iov[1].iov_len */
	int via;                /* SMCLO_VIA_* */
};

/*
 * Claim at least @min bytes (1 if 0) of send space on connected TCP socket
 * @fd: all that is free is returned in @span (so len >= min), to be written
 * in place.  Waits for the space unless @flags has SMCLO_DONTWAIT or the
 * descriptor is non-blocking.  Returns span->len, or -1 with errno:
 *   EAGAIN        no space now (or SO_SNDTIMEO expired)
 *   EMSGSIZE      @min larger than the ring, or on TCP than SMCLO_STAGE_MAX
 *   EPIPE, ECONNRESET   the connection is gone
 *   EINTR         a signal handler without SA_RESTART interrupted the wait
 *   EBADF, ENOTSOCK, ENOTCONN, EOPNOTSUPP   not a connected TCP socket
 *   ENOBUFS       the thread already holds 8 claims and peeks
 *   EINVAL        @span NULL, or unknown flags
 * A second claim of the thread on @fd replaces the first, as an abort would.
 */
ssize_t smclo_send_claim(int fd, size_t min, struct smclo_span *span, int flags);

/*
 * Publish the first @n bytes of this thread's claim on @fd (n <= the
 * claim's len; 0 publishes nothing) and end the claim.  @flags is 0, or
 * SMCLO_KEEP: the claim goes on after the bytes published (its len less
 * them), so one claim can carry many messages, each the peer's as it is
 * committed - page_frag's prepare serving many fragments from one page.  On a
 * ring the bytes are the peer's at once.  On TCP they are sent as send()
 * would send them: all of them, waiting for socket space - but a
 * non-blocking socket, an expired SO_SNDTIMEO or a signal without
 * SA_RESTART can stop it part way, and then the count sent is returned, as
 * send() returns it (a claim of the probe form, SMCLO_DONTWAIT, is only as
 * large as the socket can take at once).  Never raises SIGPIPE.  Returns
 * the bytes published, or -1 with errno:
 *   EINVAL        no claim of this thread on @fd (never made, ended, or
 *                 made on a descriptor since closed or reused), @n larger
 *                 than it, or unknown @flags (the claim then stays)
 * With SMCLO_KEEP, EAGAIN and EINTR leave the claim as it was, and on TCP
 * a commit that sent part of @n returns that count and the claim goes on
 * at the first byte not sent.
 *   EPIPE, ECONNRESET   the peer went away (TCP), or this thread shut
 *                 down writing meanwhile
 *   EAGAIN, EINTR as above, before a byte was sent (TCP)
 */
ssize_t smclo_send_commit(int fd, size_t n, int flags);

/* End this thread's claim on @fd without publishing.  0, or -1/EINVAL. */
int smclo_send_abort(int fd);

#define SMCLO_STAGE_MAX (16u << 20)     /* the largest claim on TCP */
#define SMCLO_PEEK_MAX  (1u << 20)      /* the largest @min of a peek on TCP */

/*
 * The received bytes of @fd where they lie, at least @min of them (1 if 0)
 * unless the stream ends first - or a buffer of the sender's pool begins or
 * ends within them: a peek shows one run in one place (span->via is
 * SMCLO_VIA_POOL for a pool buffer's bytes; consuming its last byte gives
 * the buffer back to the sender).  Waits unless @flags has SMCLO_DONTWAIT or
 * the descriptor is non-blocking.  Returns span->len, 0 at the end of the
 * stream, or -1 with errno:
 *   EAGAIN        fewer than @min bytes now and not to wait, or SO_RCVTIMEO
 *                 expired
 *   EMSGSIZE      @min larger than the ring, or on TCP than SMCLO_PEEK_MAX
 *                 (the kernel must be able to queue that many bytes)
 *   ECONNRESET    the peer reset the connection or broke smclo's protocol
 *   EINTR         a signal handler without SA_RESTART interrupted the wait
 *   EBADF, ENOTSOCK, ENOTCONN, EOPNOTSUPP, ENOBUFS, EINVAL   as for a claim
 * The bytes stay until smclo_recv_consume(); a second peek of the thread
 * on @fd looks again (it may show more).  The sender gets its space back
 * only with the consume: a reader of a long stream consumes as it goes (a
 * quarter of the ring at a time, say), or the sender waits while it reads.  Bytes in a ring are read-only,
 * and the peer process can still write them: check what you parse, as you
 * would a copy.
 */
ssize_t smclo_recv_peek(int fd, size_t min, struct smclo_span *span, int flags);

/*
 * Consume the first @n bytes of this thread's peek on @fd (n <= its len; 0
 * consumes nothing) and end the peek.  Returns 0, or -1 with errno EINVAL
 * (no peek of this thread on @fd - never made, ended, or made on a
 * descriptor since closed or reused - or @n larger than it; the peek then
 * stays), or on TCP what recv() says when the bytes are gone (another
 * thread read them).
 */
int smclo_recv_consume(int fd, size_t n);

/* ---- buffer pools: zero-copy sends with completions -------------------- */

/*
 * A pool belongs to one connection and to the process that made it: its
 * memory is a memfd this process maps read-write, sealed so that no other
 * process can map it writable, handed to the peer (and to no third process)
 * with the connection's first doorbell after its creation.  Until the peer
 * has mapped it - and always on TCP - a send copies the buffer's bytes
 * into the ring (or the socket) and its notification says
 * SMCLO_CQE_F_COPIED: the calls work everywhere, only the copy differs.
 * On TCP to another host (not a loopback address) a send of 10 KiB or more
 * goes with the kernel's zero copy - io_uring's SEND_ZC, or MSG_ZEROCOPY
 * where io_uring is not allowed or SMCLO_IO_URING=0: the buffer is the
 * library's until the kernel notifies it (SMCLO_CQE_F_KERNEL, and
 * SMCLO_CQE_F_COPIED if the kernel copied after all).  With MSG_ZEROCOPY
 * the socket's error queue is the pool's: do not use MSG_ZEROCOPY or
 * IP_RECVERR on it.
 */
struct smclo_pool;

#define SMCLO_POOL_BUFS_MAX 64          /* buffers of one pool, at most */
#define SMCLO_POOL_MAX (1u << 30)       /* bytes of one pool, at most */

/* Completion flags (struct smclo_cqe.flags). */
#define SMCLO_CQE_F_MORE      0x1   /* request: a notification will follow */
#define SMCLO_CQE_F_NOTIF     0x2   /* notification: buffers free again */
#define SMCLO_CQE_F_COPIED    0x4   /* notification: the bytes were copied */
#define SMCLO_CQE_F_RECLAIMED 0x8   /* notification: the peer went away first */
#define SMCLO_CQE_F_KERNEL    0x10  /* notification: the kernel's zero copy sent it */

/*
 * One completion.  Every send that succeeds gives two, in this order: the
 * request's (@res the bytes sent, SMCLO_CQE_F_MORE set) and, once the peer
 * is done with the buffer, its notification (SMCLO_CQE_F_NOTIF, @res 0).
 * Notifications of consecutive sends that come together are merged into
 * one: @count sends from the one whose @user_data it carries.  A send
 * that fails completes only through its return value, and its buffer stays
 * the program's.
 */
struct smclo_cqe {
	unsigned long long user_data;
	long long res;
	unsigned int flags;     /* SMCLO_CQE_F_* */
	unsigned int count;     /* sends covered: 1, or more for a merged notification */
};

/*
 * Make a pool of @nbufs buffers (1..SMCLO_POOL_BUFS_MAX) of @buf_size bytes
 * (rounded up to pages; SMCLO_POOL_MAX in all at most) for connected TCP
 * socket @fd; @flags is 0.  Returns the pool, or NULL with errno:
 *   EINVAL        sizes out of range, or @flags not 0
 *   EBUSY         @fd already had a pool (one per connection, for its life)
 *   ENOMEM, EMFILE, ENFILE   no memory or descriptors for it
 *   EBADF, ENOTSOCK, ENOTCONN, EOPNOTSUPP, EPIPE   as for a claim
 */
struct smclo_pool *smclo_pool_create(int fd, size_t buf_size, unsigned nbufs, int flags);

/*
 * A free buffer of @p, of the pool's buffer size, to fill and send; never
 * waits.  NULL with errno ENOBUFS when every buffer is out (handed out, or
 * sent and its notification not reaped yet: a peer that never reads cannot
 * make the pool grow), EPERM in a process that did not make the pool.
 */
void *smclo_pool_get(struct smclo_pool *p);

/* Give back an unsent buffer got from @p.  0, or -1/EINVAL. */
int smclo_pool_put(struct smclo_pool *p, void *buf);

/*
 * Send the first @len bytes (1..buffer size) of @buf, a buffer got from @p
 * and not sent since, on the pool's connection, after everything sent on
 * it before.  Waits for room unless @flags has SMCLO_DONTWAIT or the
 * descriptor is non-blocking.  The buffer is the library's until its
 * notification is reaped: do not write it meanwhile (the peer may be
 * reading it in place).  Returns @len, or -1 with errno (the buffer then
 * stays the program's, and nothing is queued):
 *   EAGAIN, EINTR, EPIPE, ECONNRESET   as for send()
 *   EINVAL        @buf not an unsent buffer of @p, @len out of range, or
 *                 unknown @flags
 *   EBADF         the pool's descriptor was closed (or now names another file)
 *   EDEADLK       this thread holds a claim on the connection
 *   EPERM         a process that did not make the pool
 * On a non-blocking TCP socket or a copy into a full ring it may send part
 * of the buffer, as send() does: the count is returned and completed.
 */
ssize_t smclo_pool_send(struct smclo_pool *p, void *buf, size_t len,
                        unsigned long long user_data, int flags);

/*
 * Move up to @max completions of @p into @cqes; never waits.  Returns how
 * many (0: none now), or -1 with errno EINVAL or EPERM.  A reaped
 * notification gives its buffers back to the pool.  When the peer closed or
 * went away, every buffer still out is notified with SMCLO_CQE_F_RECLAIMED.
 */
int smclo_reap(struct smclo_pool *p, struct smclo_cqe *cqes, unsigned max);

/*
 * A descriptor that polls readable when smclo_reap() may have something
 * (the peer released a buffer, a copied send completed, the peer went
 * away); owned by the pool.  -1/EINVAL for a NULL pool.
 */
int smclo_pool_fd(struct smclo_pool *p);

/*
 * Free @p: its memory is unmapped here (the peer keeps what it mapped
 * until it is done) and its buffers are gone, outstanding or not.  The
 * connection stays open, without a pool.  0, or -1/EINVAL.
 */
int smclo_pool_destroy(struct smclo_pool *p);

/*
 * How connected TCP socket @fd carries bytes now: SMCLO_VIA_RING or
 * SMCLO_VIA_COPY; or -1 with errno EBADF, ENOTSOCK, ENOTCONN, EOPNOTSUPP.
 * A connection whose handshake is still undecided is decided first.
 */
int smclo_via(int fd);

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *smclo_version(void);

#ifdef __cplusplus
}
#endif

#endif
