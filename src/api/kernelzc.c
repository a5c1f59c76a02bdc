/*
 * kernelzc.c - a pool's sends by the kernel's zero copy, to another host
 * (kernelzc.h).
 *
 * io_uring's SEND_ZC first: the pool's memory is registered once, so the
 * kernel pins nothing per send, and the notifications come in the ring's
 * completion queue, which the pool's descriptor polls.  Each submission is
 * non-blocking and waited for at once - its request's completion tells how
 * much the socket took, and the rest goes as send() would send it
 * (api_send_all_by: waiting for room, SO_SNDTIMEO, signals), so the byte
 * stream stays in the order of the program's calls.  Each submission that
 * took bytes is one notification to wait for (IORING_CQE_F_MORE).
 *
 * MSG_ZEROCOPY where io_uring is not there (a container's seccomp filter,
 * sysctl kernel.io_uring_disabled, SMCLO_IO_URING=0): each send() that
 * takes bytes gets the socket's next notification id, and the kernel
 * reports ranges of ids done on the socket's error queue.
 */
#include "kernelzc.h"
#include "api.h"
#include "io.h"
#include "sys.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

/* The smallest send worth the kernel's zero copy: below it, pinning pages
 * and the notification cost more than the copy they save. */
#define KERNEL_ZC_MIN (10u << 10)

/* io_uring completions name the buffer (6 bits: SMCLO_POOL_BUFS_MAX) and
 * the send, so that a late notification of an earlier send of the same
 * buffer is never taken for the current one's. */
#define ID_BITS 6
_Static_assert(SMCLO_POOL_BUFS_MAX <= 1u << ID_BITS, "a buffer's index fits in ID_BITS");

/* Is @fd connected to a loopback address?  There the kernel copies anyway
 * (skb_orphan_frags_rx) and says so: not worth the pinning. */
static int to_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);

	if (sys_getpeername(fd, (struct sockaddr *)&ss, &l) < 0)
		return 1;
	if (ss.ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
		return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
	}
	if (ss.ss_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
		return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return 1;
}

void kernel_zc_init(struct kernel_zc *z, int fd, int epfd, void *base, size_t len,
                    unsigned nbufs, int uring)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int one = 1;

	memset(z, 0, sizeof(*z));
	z->fd = fd;
	z->epfd = epfd;
	z->ring.fd = -1;
	if (to_loopback(fd))
		return;
	if (uring && uring_open(&z->ring, nbufs, base, len) == 0) {
		/* out of the program's way, as the pool's other descriptors
		 * (its mappings and registration stay with the ring itself) */
		z->ring.fd = io_keep_fd(z->ring.fd);
		if (sys_epoll_ctl(epfd, EPOLL_CTL_ADD, z->ring.fd, &ev) == 0) {
			z->way = KZC_URING;
			return;
		}
		uring_close(&z->ring);
	}
	if (sys_setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) == 0)
		z->way = KZC_MSG;
}

void kernel_zc_free(struct kernel_zc *z)
{
	if (z->way == KZC_URING)
		uring_close(&z->ring);
	z->way = KZC_NONE;
}

int kernel_zc_worth(const struct kernel_zc *z, size_t len)
{
	return z->way != KZC_NONE && len >= KERNEL_ZC_MIN;
}

uint32_t kernel_zc_left(const struct kernel_zc *z, unsigned i)
{
	return z->bufs[i].left;
}

/* One notification of buffer @i's send @gen came (@copied: a copy after all). */
static void notified(struct kernel_zc *z, unsigned i, uint64_t gen, int copied,
                     kernel_zc_done_fn done, void *ctx)
{
	struct kernel_zc_buf *b = &z->bufs[i];

	if (b->gen != gen || !b->left)
		return;         /* of a send whose buffer came back already */
	b->copied |= copied;
	if (!--b->left)
		done(ctx, i, b->copied);
}

/* ---- io_uring ------------------------------------------------------------ */

/* What one io_uring submission needs besides the bytes. */
struct uring_send {
	struct kernel_zc *z;
	unsigned i;
	kernel_zc_done_fn done;
	void *ctx;
};

/* Take one completion: a notification, or (the count) the request of the
 * send in flight, *@res set. */
static void uring_took(struct kernel_zc *z, const struct uring_cqe *cqe, int64_t *res,
                       kernel_zc_done_fn done, void *ctx)
{
	unsigned i = (unsigned)(cqe->user_data & ((1u << ID_BITS) - 1));
	uint64_t gen = cqe->user_data >> ID_BITS;

	if (cqe->flags & IORING_CQE_F_NOTIF)
		notified(z, i, gen, (uint32_t)cqe->res & IORING_NOTIF_USAGE_ZC_COPIED, done, ctx);
	else if (z->bufs[i].gen == gen && res)
		*res = cqe->res;
}

/* api_send_once_fn: one SEND_ZC that does not wait for room, waited for. */
static ssize_t uring_send_once(void *arg, int fd, const void *buf, size_t n)
{
	struct uring_send *s = arg;
	struct kernel_zc *z = s->z;
	struct kernel_zc_buf *b = &z->bufs[s->i];
	uint64_t user_data = b->gen << ID_BITS | s->i;
	int64_t res = INT64_MIN;
	struct uring_cqe cqe;
	int r = uring_send_zc(&z->ring, fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT, user_data);

	if (r < 0) {
		errno = -r;
		return -1;
	}
	/* not waiting for room, it completes inside the submission: the
	 * wait is for the completion's posting, signals or not */
	while (res == INT64_MIN) {
		if (uring_next(&z->ring, &cqe)) {
			uring_took(z, &cqe, &res, s->done, s->ctx);
			if (res != INT64_MIN && (cqe.flags & IORING_CQE_F_MORE))
				b->left++;      /* its notification follows */
		} else if ((r = uring_wait(&z->ring)) < 0 && r != -EINTR) {
			errno = -r;
			return -1;      /* cannot happen: the ring is ours */
		}
	}
	if (res > 0)
		b->sent = 1;
	if (res <= 0) {
		errno = res ? (int)-res : EAGAIN;
		return -1;
	}
	return (ssize_t)res;
}

static ssize_t uring_send(struct kernel_zc *z, unsigned i, const void *buf, size_t len,
                          int dontwait, kernel_zc_done_fn done, void *ctx)
{
	struct uring_send s = { z, i, done, ctx };
	ssize_t n;

	if (!dontwait)
		return api_send_all_by(z->fd, buf, len, uring_send_once, &s, NULL);
	n = uring_send_once(&s, z->fd, buf, len);
	return n < 0 ? -errno : n;
}

static void uring_collect(struct kernel_zc *z, kernel_zc_done_fn done, void *ctx)
{
	struct uring_cqe cqe;

	while (uring_next(&z->ring, &cqe))
		uring_took(z, &cqe, NULL, done, ctx);
}

/* ---- MSG_ZEROCOPY ----------------------------------------------------------- */

static void msg_collect(struct kernel_zc *z, kernel_zc_done_fn done, void *ctx);

/* What one MSG_ZEROCOPY send() call needs besides the bytes. */
struct msg_send {
	struct kernel_zc *z;
	unsigned i;
	kernel_zc_done_fn done;
	void *ctx;
};

/*
 * api_send_once_fn: one send(MSG_ZEROCOPY).  A call that takes bytes is
 * the socket's next notification id, counted at once: notifications taken
 * while the send goes on may already cover it.  Without room, the error
 * queue's notifications are taken first - they make the socket report an
 * error, and the wait for room would return at once, for ever.
 */
static ssize_t msg_send_once(void *arg, int fd, const void *buf, size_t n)
{
	struct msg_send *s = arg;
	struct kernel_zc *z = s->z;
	struct kernel_zc_buf *b = &z->bufs[s->i];
	struct epoll_event ev = { .events = 0 };
	ssize_t w = sys_send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT | MSG_ZEROCOPY);

	if (w > 0) {
		b->count++;
		b->left++;
		b->sent = 1;
		z->next_id++;
		/* the notifications make the socket report an error: no events
		 * asked, the pool's descriptor wakes for it */
		if (!z->watched && sys_epoll_ctl(z->epfd, EPOLL_CTL_ADD, z->fd, &ev) == 0)
			z->watched = 1;
	} else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		msg_collect(z, s->done, s->ctx);
		errno = EAGAIN;
	}
	return w;
}

static ssize_t msg_send(struct kernel_zc *z, unsigned i, const void *buf, size_t len,
                        int dontwait, kernel_zc_done_fn done, void *ctx)
{
	struct msg_send s = { z, i, done, ctx };
	ssize_t n;

	z->bufs[i].first = z->next_id;
	if (!dontwait)
		return api_send_all_by(z->fd, buf, len, msg_send_once, &s, NULL);
	n = msg_send_once(&s, z->fd, buf, len);
	return n < 0 ? -errno : n;
}

/* The kernel says ids @lo..@hi are done. */
static void msg_done(struct kernel_zc *z, uint32_t lo, uint32_t hi, int copied,
                     kernel_zc_done_fn done, void *ctx)
{
	int64_t h = (int32_t)(hi - lo);

	for (unsigned i = 0; i < SMCLO_POOL_BUFS_MAX; i++) {
		struct kernel_zc_buf *b = &z->bufs[i];
		int64_t first, last, n;

		if (!b->left)
			continue;
		first = (int32_t)(b->first - lo);
		last = first + b->count - 1;
		n = (last < h ? last : h) - (first > 0 ? first : 0) + 1;
		for (; n > 0 && b->left; n--)
			notified(z, i, b->gen, copied, done, ctx);
	}
}

/* The socket's error queue: entries of another origin are not ours to keep
 * (a program sharing the queue would have got them from recvmsg() itself). */
static void msg_collect(struct kernel_zc *z, kernel_zc_done_fn done, void *ctx)
{
	int out = 0;

	for (;;) {
		union {
			struct cmsghdr align;
			char buf[CMSG_SPACE(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in6))];
		} u;
		struct msghdr m = { .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };

		if (sys_recvmsg(z->fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
			break;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
			struct sock_extended_err ee;

			if (!((cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) ||
			      (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR)))
				continue;
			memcpy(&ee, CMSG_DATA(cm), sizeof(ee));
			if (ee.ee_errno == 0 && ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY)
				msg_done(z, ee.ee_info, ee.ee_data,
				         ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED, done, ctx);
		}
	}
	for (unsigned i = 0; i < SMCLO_POOL_BUFS_MAX; i++)
		out |= z->bufs[i].left != 0;
	if (!out && z->watched) {
		/* nothing more to come: its hang-up must not keep the pool readable */
		sys_epoll_ctl(z->epfd, EPOLL_CTL_DEL, z->fd, NULL);
		z->watched = 0;
	}
}

/* ---- either ------------------------------------------------------------------ */

/* Did the kernel refuse to pin more pages (RLIMIT_MEMLOCK, optmem)? */
static int pinning_refused(int err)
{
	return err == ENOBUFS || err == ENOMEM;
}

ssize_t kernel_zc_send(struct kernel_zc *z, unsigned i, const void *buf, size_t len,
                       int dontwait, kernel_zc_done_fn done, void *ctx)
{
	struct kernel_zc_buf *b = &z->bufs[i];
	ssize_t n, rest;

	*b = (struct kernel_zc_buf){ .gen = ++z->gen };
	n = z->way == KZC_URING ? uring_send(z, i, buf, len, dontwait, done, ctx)
	                        : msg_send(z, i, buf, len, dontwait, done, ctx);
	if (n < 0 && pinning_refused((int)-n))
		return -ENOBUFS;        /* nothing sent: the caller copies */
	/* the kernel stopped pinning part-way (errno from the call that
	 * failed): the rest is copied, as a send() would send it */
	if (n > 0 && (size_t)n < len && !dontwait && pinning_refused(errno)) {
		rest = api_send_all(z->fd, (const char *)buf + n, len - (size_t)n, 0, NULL);
		if (rest > 0) {
			n += rest;
			b->copied = 1;
		}
	}
	return n;
}

void kernel_zc_collect(struct kernel_zc *z, kernel_zc_done_fn done, void *ctx)
{
	if (z->way == KZC_URING)
		uring_collect(z, done, ctx);
	else if (z->watched)
		msg_collect(z, done, ctx);
}
