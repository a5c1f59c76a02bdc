/*
 * test_uring.c - the small io_uring of src/base/uring.c, one behaviour each:
 * a SEND_ZC from registered memory completes twice (the request with
 * IORING_CQE_F_MORE, then the notification, which over loopback says the
 * kernel copied), the bytes arrive, a send the socket has no room for
 * fails with EAGAIN at once (MSG_DONTWAIT), a send to a descriptor that is
 * no socket fails in its completion (and is still notified if its request
 * says IORING_CQE_F_MORE), and the completions come in order.
 *
 * Where io_uring is not allowed (a seccomp filter, kernel.io_uring_disabled)
 * uring_open must fail cleanly, and the test says so and checks only that.
 */
#include "check.h"

#include "uring.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define LEN (64u << 10)

/* A connected TCP pair over loopback: @s the sender, @r the receiver. */
static int tcp_pair(int *s, int *r)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);

	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 1) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &l) < 0)
		return -1;
	*s = socket(AF_INET, SOCK_STREAM, 0);
	if (*s < 0 || connect(*s, (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	*r = accept(lfd, NULL, NULL);
	close(lfd);
	return *r < 0 ? -1 : 0;
}

/* The next completion, waiting for it. */
static struct uring_cqe next(struct uring *u)
{
	struct uring_cqe c = { 0 };

	while (!uring_next(u, &c))
		uring_wait(u);
	return c;
}

static void send_twice_completed(struct uring *u, uint8_t *mem, int s, int r)
{
	uint8_t *got = malloc(LEN);
	struct uring_cqe req, notif;
	size_t have = 0;

	for (unsigned i = 0; i < LEN; i++)
		mem[i] = (uint8_t)(i * 7 + 3);
	CHECK(uring_send_zc(u, s, mem, LEN, MSG_NOSIGNAL | MSG_WAITALL, 42) == 0);
	req = next(u);
	CHECK(req.user_data == 42 && req.res == (int32_t)LEN);
	CHECK(!(req.flags & IORING_CQE_F_NOTIF) && (req.flags & IORING_CQE_F_MORE));
	notif = next(u);
	CHECK(notif.user_data == 42 && (notif.flags & IORING_CQE_F_NOTIF));
	/* looped back, the kernel copied after all, and says so */
	CHECK((uint32_t)notif.res & IORING_NOTIF_USAGE_ZC_COPIED);
	while (have < LEN) {
		ssize_t n = read(r, got + have, LEN - have);
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	CHECK(have == LEN && memcmp(got, mem, LEN) == 0);
	free(got);
}

static void full_socket_fails_at_once(struct uring *u, uint8_t *mem, int s)
{
	struct uring_cqe c;
	int small = 4096, eagain = 0;

	setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	/* nobody reads: soon the socket has no room, and a send that may not
	 * wait completes with -EAGAIN instead of waiting */
	for (int i = 0; i < 4096 && !eagain; i++) {
		CHECK(uring_send_zc(u, s, mem, LEN, MSG_NOSIGNAL | MSG_DONTWAIT, 100 + i) == 0);
		do
			c = next(u);
		while (c.flags & IORING_CQE_F_NOTIF);
		CHECK(c.user_data == (uint64_t)(100 + i));
		eagain = c.res == -EAGAIN;
	}
	CHECK(eagain);
}

static void not_a_socket_fails(struct uring *u, uint8_t *mem)
{
	int p[2];
	struct uring_cqe c;

	CHECK(pipe(p) == 0);
	CHECK(uring_send_zc(u, p[1], mem, 16, MSG_NOSIGNAL, 7) == 0);
	c = next(u);
	CHECK(c.user_data == 7 && c.res == -ENOTSOCK && !(c.flags & IORING_CQE_F_NOTIF));
	/* a failed send may still be notified (kernels set F_MORE here):
	 * kernelzc.c counts what F_MORE promises, whatever the result */
	if (c.flags & IORING_CQE_F_MORE) {
		c = next(u);
		CHECK(c.user_data == 7 && (c.flags & IORING_CQE_F_NOTIF));
	}
	close(p[0]);
	close(p[1]);
}

int main(void)
{
	uint8_t *mem = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uring u;
	int s = -1, r = -1, e;

	CHECK(mem != MAP_FAILED);
	e = uring_open(&u, 8, mem, LEN);
	if (e < 0) {
		printf("test_uring: io_uring not allowed here (%s): uring_open failed cleanly\n",
		       strerror(-e));
		CHECK(u.fd == -1);
		return check_report("test_uring");
	}
	CHECK(tcp_pair(&s, &r) == 0);
	send_twice_completed(&u, mem, s, r);
	not_a_socket_fails(&u, mem);
	full_socket_fails_at_once(&u, mem, s);
	uring_close(&u);
	CHECK(u.fd == -1);
	close(s);
	close(r);
	return check_report("test_uring");
}
