/*
 * pool_peer.c - one end of a connection sending from a buffer pool of the
 * native API (include/smclo.h), for tests/py/test_pool.py.
 *
 *   pool_peer serve   HOST PORT SCENARIO    listen, print "ready", take one connection
 *   pool_peer connect HOST PORT SCENARIO
 *
 * The client sends, the server reads.  Every byte of the stream is a
 * function of its offset, so the reader checks each where it sits, whether
 * it came by reference, by copy, or by write().  Each end prints "ok ..."
 * with its figures, or "FAIL ..." and exits 1.
 *
 *   bulk    300 messages of 1 B .. 1 MiB from a pool of 8 x 1 MiB, every
 *           seventh a write() instead; the server reads with peeks (in
 *           place: via=pool for referenced bytes) and read()s of odd sizes;
 *           every send completes twice, every notification is reaped
 *   hold    the server stops reading: 4 sends take the 4 buffers, the 5th
 *           get fails with ENOBUFS and nothing is notified; once it reads,
 *           smclo_pool_fd() wakes the client and all 4 come back
 *   killed  the server dies (SIGKILL) holding a peek of a referenced buffer:
 *           the pool's descriptor wakes and every buffer out comes back
 *           SMCLO_CQE_F_RECLAIMED
 *   fork    a fork child cannot use its parent's pool (EPERM) and frees its
 *           copy; the parent goes on, every byte arrives
 *   errors  EINVAL, ENOBUFS, EBUSY, ENOTSOCK, EBADF, EDEADLK as smclo.h lists them
 *   sndtimeo  the server stops reading for 2 s; the client's SO_SNDTIMEO is
 *           100 ms: no blocking send may wait much longer than that (on
 *           TCP each ends in EAGAIN or a short count, the rest is sent
 *           again or written), and every byte arrives
 *   shut    both ends shut down writing while 8 buffers sent by reference
 *           are unread (the server waits half a second before it reads):
 *           no buffer may come back RECLAIMED - the peer lives - and each
 *           is scribbled over as it comes back, which the reader would see
 *           if it came back early
 *   shutkilled  the same, but the server dies (SIGKILL) without reading:
 *           all 8 come back RECLAIMED (the connection's hang-up says
 *           nothing once both sides shut down writing; the pool's release
 *           socket does)
 *   closekilled  the client closes its descriptor with 8 buffers unread,
 *           then the server dies without reading: all 8 come back
 *           RECLAIMED to the pool, which outlives the descriptor
 *
 * "ok" reports the notifications by kind: refs (read in place by the peer),
 * copied (SMCLO_CQE_F_COPIED), kernel (SMCLO_CQE_F_KERNEL: io_uring SEND_ZC or
 * MSG_ZEROCOPY, to another host) and reclaimed; bulk adds the completions
 * of the process's io_uring (uring_cqes).
 */
#include "smclo.h"
#include "scenario.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSGS 300
#define BUF_SIZE (1u << 20)


static uint8_t pattern(uint64_t off)
{
	return (uint8_t)(off * 131 + (off >> 11) * 7 + 1);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

static const char *via_name(int via)
{
	return via == SMCLO_VIA_RING ? "ring" : via == SMCLO_VIA_POOL ? "pool" : "copy";
}

static void fill(uint8_t *p, size_t n, uint64_t off)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern(off + i);
}

static void check_bytes(const uint8_t *p, size_t n, uint64_t off, const char *how)
{
	for (size_t i = 0; i < n; i++)
		CHECK(p[i] == pattern(off + i), "%s: byte %llu is %u, not %u", how,
		      (unsigned long long)(off + i), p[i], pattern(off + i));
}



/* ---- the sender's bookkeeping ----------------------------------------------- */

static struct tally {
	uint64_t sent, requests, notified, copied, reclaimed, kernel, refs, notif_cqes;
	size_t len[MSGS + 16];
} t;

static void reap_all(struct smclo_pool *p)
{
	struct smclo_cqe c[16];
	int n;

	while ((n = smclo_reap(p, c, 16)) > 0)
		for (int i = 0; i < n; i++) {
			if (c[i].flags & SMCLO_CQE_F_NOTIF) {
				CHECK(c[i].res == 0 && c[i].count >= 1, "notification res %lld", c[i].res);
				t.notified += c[i].count;
				t.notif_cqes++;
				if (c[i].flags & SMCLO_CQE_F_COPIED)
					t.copied += c[i].count;
				if (c[i].flags & SMCLO_CQE_F_RECLAIMED)
					t.reclaimed += c[i].count;
				if (c[i].flags & SMCLO_CQE_F_KERNEL)
					t.kernel += c[i].count;
				if (c[i].flags == SMCLO_CQE_F_NOTIF)
					t.refs += c[i].count;   /* read in place by the peer */
			} else {
				CHECK(c[i].flags == SMCLO_CQE_F_MORE && c[i].count == 1,
				      "request flags %#x", c[i].flags);
				CHECK(c[i].user_data < MSGS + 16 &&
				      c[i].res == (long long)t.len[c[i].user_data],
				      "request %llu res %lld", c[i].user_data, c[i].res);
				t.requests++;
			}
		}
	CHECK(n == 0, "smclo_reap");
}

/* Wait (at most 10 s) for the pool's descriptor, then reap. */
static void wait_and_reap(struct smclo_pool *p)
{
	struct pollfd pfd = { .fd = smclo_pool_fd(p), .events = POLLIN };

	CHECK(poll(&pfd, 1, 10000) == 1, "the pool's descriptor never woke");
	reap_all(p);
}

static void *get_buffer(struct smclo_pool *p)
{
	void *b;

	while (!(b = smclo_pool_get(p))) {
		CHECK(errno == ENOBUFS, "smclo_pool_get");
		wait_and_reap(p);
	}
	return b;
}

static uint64_t wpos;

static void pool_send(struct smclo_pool *p, size_t len)
{
	uint8_t *b = get_buffer(p);
	ssize_t r;

	fill(b, len, wpos);
	t.len[t.sent] = len;
	r = smclo_pool_send(p, b, len, t.sent, 0);
	CHECK(r == (ssize_t)len, "smclo_pool_send %zu gave %zd", len, r);
	t.sent++;
	wpos += len;
}

static void wait_all_notified(struct smclo_pool *p)
{
	reap_all(p);
	while (t.notified < t.sent)
		wait_and_reap(p);
	CHECK(t.requests == t.sent && t.notified == t.sent, "%llu sends, %llu requests, %llu notified",
	      (unsigned long long)t.sent, (unsigned long long)t.requests,
	      (unsigned long long)t.notified);
}

static void report(int fd, const char *extra)
{
	printf("ok via=%s sent=%llu copied=%llu refs=%llu kernel=%llu notif_cqes=%llu reclaimed=%llu "
	       "%s\n", via_name(smclo_via(fd)), (unsigned long long)t.sent,
	       (unsigned long long)t.copied, (unsigned long long)t.refs,
	       (unsigned long long)t.kernel, (unsigned long long)t.notif_cqes,
	       (unsigned long long)t.reclaimed, extra);
}

/* Completions the process's io_uring instances delivered (the pool's, when
 * its sends went with SEND_ZC): their fdinfo's CqHead, summed. */
static unsigned long long uring_completions(void)
{
	unsigned long long sum = 0;
	char path[300], link[64], line[128];

	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	/* every descriptor: smclo keeps its own far above the program's */
	while (d && (e = readdir(d))) {
		ssize_t n;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = 0;
		if (strcmp(link, "anon_inode:[io_uring]") != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%s", e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "CqHead:", 7))
				sum += strtoull(line + 7, NULL, 10);
		fclose(f);
	}
	if (d)
		closedir(d);
	return sum;
}

/* Make sure the peer mapped the pool (a round trip: it takes the pool from
 * the doorbell when its read finds the ring empty). */
static void write_pattern(int fd, size_t n)
{
	uint8_t b[64];

	fill(b, n, wpos);
	write_all(fd, b, n);
	wpos += n;
}

static void handshake_pool(int fd)
{
	char b[2];

	write_pattern(fd, 2);
	read_exact(fd, b, 2);
}

/* ---- the reader ------------------------------------------------------------- */

static uint64_t rpos, pool_peeks;

/* Read @n bytes (all, if -1) with peeks and reads of odd sizes; 0 at EOF. */
static int read_some(int fd, uint64_t n)
{
	static uint8_t buf[5000];
	uint64_t end = rpos + n;

	while (rpos < end) {
		if (rnd(2)) {
			struct smclo_span s;
			ssize_t r = smclo_recv_peek(fd, 1 + rnd(3000), &s, 0);
			size_t take;

			CHECK(r >= 0, "smclo_recv_peek");
			if (r == 0)
				return 0;
			if (s.via == SMCLO_VIA_POOL)
				pool_peeks++;
			check_bytes(s.iov[0].iov_base, s.iov[0].iov_len, rpos, "peek");
			check_bytes(s.iov[1].iov_base, s.iov[1].iov_len, rpos + s.iov[0].iov_len, "peek");
			take = rnd(4) ? (size_t)r : 1 + rnd((uint32_t)r);
			CHECK(smclo_recv_consume(fd, take) == 0, "consume");
			rpos += take;
		} else {
			size_t want = 1 + rnd(sizeof(buf));
			ssize_t r;

			if (want > end - rpos)
				want = (size_t)(end - rpos);
			r = read(fd, buf, want);
			CHECK(r >= 0, "read");
			if (r == 0)
				return 0;
			check_bytes(buf, (size_t)r, rpos, "read");
			rpos += (uint64_t)r;
		}
	}
	return 1;
}

static void answer_go(int fd)
{
	CHECK(read_some(fd, 2) == 1, "no go");
	write_all(fd, "ok", 2);
}

/* Read to the end, answer the byte count. */
static void drain_rest(int fd)
{
	while (read_some(fd, UINT64_MAX - rpos))
		;
	write_all(fd, &rpos, sizeof(rpos));
	printf("ok via=%s pool_peeks=%llu bytes=%llu\n", via_name(smclo_via(fd)),
	       (unsigned long long)pool_peeks, (unsigned long long)rpos);
}

static void drain_server(int fd)
{
	answer_go(fd);
	drain_rest(fd);
}

static void expect_total(int fd)
{
	uint64_t total;

	shutdown(fd, SHUT_WR);
	read_exact(fd, &total, sizeof(total));
	CHECK(total == wpos, "the server read %llu bytes of %llu", (unsigned long long)total,
	      (unsigned long long)wpos);
}

/* ---- scenarios -------------------------------------------------------------- */

static void bulk_client(int fd)
{
	struct smclo_pool *p = smclo_pool_create(fd, BUF_SIZE, 8, 0);
	static const size_t sizes[] = { 1, 100, 4096, 65536, 300000, BUF_SIZE };
	char extra[64];

	CHECK(p, "smclo_pool_create");
	handshake_pool(fd);
	for (int i = 0; i < MSGS; i++) {
		size_t len = rnd(3) ? sizes[rnd(6)] : 1 + rnd(BUF_SIZE);

		if (i % 7 == 6) {
			uint8_t small[777];
			fill(small, sizeof(small), wpos);
			write_all(fd, small, sizeof(small));
			wpos += sizeof(small);
			continue;
		}
		pool_send(p, len);
		if (rnd(4) == 0)
			reap_all(p);
	}
	wait_all_notified(p);
	expect_total(fd);
	snprintf(extra, sizeof(extra), "uring_cqes=%llu", uring_completions());
	report(fd, extra);
	CHECK(smclo_pool_destroy(p) == 0, "destroy");
}

static void hold_client(int fd)
{
	struct smclo_pool *p = smclo_pool_create(fd, 65536, 4, 0);
	struct pollfd pfd;
	int ring = smclo_via(fd) == SMCLO_VIA_RING;

	CHECK(p, "smclo_pool_create");
	handshake_pool(fd);
	for (int i = 0; i < 4; i++)
		pool_send(p, 65536);
	reap_all(p);
	if (ring) {
		/* by reference: nothing back while the server does not read */
		CHECK(t.notified == 0, "%llu notified before the server read",
		      (unsigned long long)t.notified);
		CHECK(!smclo_pool_get(p) && errno == ENOBUFS, "a 5th buffer");
		pfd = (struct pollfd){ .fd = smclo_pool_fd(p), .events = POLLIN };
		CHECK(poll(&pfd, 1, 200) == 0, "woken with nothing released");
		write_pattern(fd, 1);           /* the server may read now */
	} else {
		CHECK(t.copied == 4, "copies notified at once");
		write_pattern(fd, 1);
	}
	wait_all_notified(p);
	CHECK(smclo_pool_get(p), "a buffer after the notifications");
	expect_total(fd);
	report(fd, "");
	smclo_pool_destroy(p);
}

static void hold_server(int fd)
{
	answer_go(fd);
	/* not a byte until the client says (its "r" comes after 256 KiB) */
	sleep(1);
	drain_rest(fd);
}

static void killed_client(int fd)
{
	struct smclo_pool *p = smclo_pool_create(fd, 65536, 4, 0);
	int ring = smclo_via(fd) == SMCLO_VIA_RING;

	CHECK(p, "smclo_pool_create");
	handshake_pool(fd);
	for (int i = 0; i < 4; i++) {
		uint8_t *b = get_buffer(p);

		/* a send after the server died hears of it */
		t.len[t.sent] = 65536;
		if (smclo_pool_send(p, b, 65536, t.sent, 0) < 0) {
			CHECK(errno == ECONNRESET || errno == EPIPE, "send");
			smclo_pool_put(p, b);
			break;
		}
		t.sent++;
	}
	while (t.notified < t.sent)
		wait_and_reap(p);
	if (ring)
		CHECK(t.reclaimed >= 1, "nothing reclaimed (%llu notified)",
		      (unsigned long long)t.notified);
	report(fd, "");
	smclo_pool_destroy(p);
}

static void killed_server(int fd)
{
	struct smclo_span s;

	answer_go(fd);
	CHECK(smclo_recv_peek(fd, 65536, &s, 0) > 0, "peek");
	printf("holding via=%s\n", via_name(s.via));
	kill(getpid(), SIGKILL);
}

static void fork_client(int fd)
{
	struct smclo_pool *p = smclo_pool_create(fd, 65536, 4, 0);
	void *spare;
	pid_t pid;
	int st;

	CHECK(p, "smclo_pool_create");
	handshake_pool(fd);
	pool_send(p, 65536);
	pool_send(p, 1000);
	spare = get_buffer(p);
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		role = "child";
		CHECK(!smclo_pool_get(p) && errno == EPERM, "child get");
		CHECK(smclo_pool_send(p, spare, 10, 99, 0) < 0 && errno == EPERM, "child send");
		CHECK(smclo_reap(p, NULL, 0) < 0 && errno == EPERM, "child reap");
		CHECK(smclo_pool_destroy(p) == 0, "child destroy");
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child");
	CHECK(smclo_pool_put(p, spare) == 0, "put");
	pool_send(p, 4096);
	pool_send(p, 65536);
	wait_all_notified(p);
	expect_total(fd);
	report(fd, "");
	smclo_pool_destroy(p);
}

static void errors_client(int fd)
{
	struct smclo_pool *p;
	int pipefd[2];
	uint8_t *b, *b2;

	CHECK(!smclo_pool_create(fd, 0, 4, 0) && errno == EINVAL, "size 0");
	CHECK(!smclo_pool_create(fd, 4096, 0, 0) && errno == EINVAL, "no buffers");
	CHECK(!smclo_pool_create(fd, 4096, SMCLO_POOL_BUFS_MAX + 1, 0) && errno == EINVAL, "65");
	CHECK(!smclo_pool_create(fd, SMCLO_POOL_MAX, 2, 0) && errno == EINVAL, "too large");
	CHECK(!smclo_pool_create(fd, 4096, 4, 1) && errno == EINVAL, "flags");
	CHECK(pipe(pipefd) == 0, "pipe");
	CHECK(!smclo_pool_create(pipefd[0], 4096, 4, 0) && errno == ENOTSOCK, "a pipe");
	CHECK(smclo_pool_get(NULL) == NULL && errno == EINVAL, "NULL pool");
	{
		/* no descriptor to spare: the creation fails, and a later one
		 * (with room again) is not refused as a second pool */
		struct rlimit was, none;
		int spare = dup(0);

		CHECK(getrlimit(RLIMIT_NOFILE, &was) == 0 && spare >= 0, "getrlimit");
		none = (struct rlimit){ (rlim_t)spare, was.rlim_max };
		close(spare);
		CHECK(setrlimit(RLIMIT_NOFILE, &none) == 0, "setrlimit");
		CHECK(!smclo_pool_create(fd, 4096, 2, 0) && errno == EMFILE, "out of descriptors");
		CHECK(setrlimit(RLIMIT_NOFILE, &was) == 0, "setrlimit back");
	}
	if (smclo_via(fd) == SMCLO_VIA_RING) {
		struct smclo_span sp;
		uint8_t *x;

		/* made, and sent from, while this thread's own claim holds the
		 * transmit lock: an error, never a hang */
		CHECK(smclo_send_claim(fd, 1, &sp, 0) > 0, "claim");
		p = smclo_pool_create(fd, 4096, 2, 0);
		CHECK(p && (x = smclo_pool_get(p)), "smclo_pool_create in own claim");
		CHECK(smclo_pool_send(p, x, 10, 0, 0) < 0 && errno == EDEADLK, "send in own claim");
		CHECK(smclo_send_abort(fd) == 0 && smclo_pool_put(p, x) == 0, "abort, put");
		CHECK(!smclo_pool_create(fd, 4096, 2, 0) && errno == EBUSY, "a second pool");
	} else {
		p = smclo_pool_create(fd, 4096, 2, 0);
		CHECK(p, "smclo_pool_create");
	}
	b = smclo_pool_get(p);          /* hands the pool over, if not done yet */
	b2 = smclo_pool_get(p);
	handshake_pool(fd);
	CHECK(b && b2 && !smclo_pool_get(p) && errno == ENOBUFS, "two buffers, then none");
	CHECK(smclo_pool_send(p, b + 1, 10, 0, 0) < 0 && errno == EINVAL, "inside a buffer");
	CHECK(smclo_pool_send(p, pipefd, 10, 0, 0) < 0 && errno == EINVAL, "not the pool's");
	CHECK(smclo_pool_send(p, b, 0, 0, 0) < 0 && errno == EINVAL, "0 bytes");
	CHECK(smclo_pool_send(p, b, 4097, 0, 0) < 0 && errno == EINVAL, "past the buffer");
	CHECK(smclo_pool_send(p, b, 10, 0, 2) < 0 && errno == EINVAL, "flags");
	fill(b, 10, wpos);
	t.len[0] = 10;
	CHECK(smclo_pool_send(p, b, 10, 0, 0) == 10, "send");
	t.sent = 1;
	wpos += 10;
	CHECK(smclo_pool_send(p, b, 10, 0, 0) < 0 && errno == EINVAL, "sent twice");
	CHECK(smclo_pool_put(p, b) < 0 && errno == EINVAL, "put a sent buffer");
	CHECK(smclo_pool_put(p, b2) == 0 && smclo_pool_put(p, b2) < 0 && errno == EINVAL, "put twice");
	CHECK(smclo_reap(p, NULL, 4) < 0 && errno == EINVAL, "reap into NULL");
	wait_all_notified(p);
	expect_total(fd);
	report(fd, "");
	/* the descriptor closed: a send names nothing */
	b = smclo_pool_get(p);
	close(fd);
	CHECK(smclo_pool_send(p, b, 10, 0, 0) < 0 && errno == EBADF, "send after close");
	CHECK(smclo_pool_destroy(p) == 0 && smclo_pool_destroy(NULL) < 0 && errno == EINVAL, "destroy");
}


static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sndtimeo_client(int fd)
{
	struct smclo_pool *p = smclo_pool_create(fd, BUF_SIZE, 8, 0);
	struct timeval tv = { 0, 100 * 1000 };
	double longest = 0;
	int eagain = 0, partial = 0, via = smclo_via(fd);
	char extra[96];

	CHECK(p, "smclo_pool_create");
	CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0, "SO_SNDTIMEO");
	handshake_pool(fd);
	for (int i = 0; i < 24; i++) {
		uint8_t *b = get_buffer(p);
		ssize_t r;

		fill(b, BUF_SIZE, wpos);
		for (;;) {
			double t0 = now_s(), took;

			r = smclo_pool_send(p, b, BUF_SIZE, t.sent, 0);
			took = now_s() - t0;
			longest = took > longest ? took : longest;
			if (r > 0)
				break;
			CHECK(errno == EAGAIN, "smclo_pool_send: not EAGAIN");
			eagain++;
			reap_all(p);
		}
		t.len[t.sent++] = (size_t)r;
		if (r < (ssize_t)BUF_SIZE) {
			/* the rest the plain way: the stream stays in order */
			struct timeval none = { 0, 0 };

			partial++;
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
			write_all(fd, b + r, BUF_SIZE - (size_t)r);
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		}
		wpos += BUF_SIZE;
		reap_all(p);
	}
	wait_all_notified(p);
	expect_total(fd);
	/* 100 ms: a send waited at most that, and some rounding */
	CHECK(longest < 1.0, "a send waited %.3f s with SO_SNDTIMEO 100 ms", longest);
	/* on TCP the pause fills the socket (by reference, 8 buffers out are
	 * all a ring ever holds of them: the gets wait instead) */
	CHECK(via == SMCLO_VIA_RING || eagain + partial > 0,
	      "the reader's pause never filled the stream");
	snprintf(extra, sizeof(extra), "eagain=%d partial=%d longest_ms=%d", eagain, partial,
	         (int)(longest * 1000));
	report(fd, extra);
	CHECK(smclo_pool_destroy(p) == 0, "destroy");
}

static void paused_server(int fd)
{
	struct timespec two = { 2, 0 };

	answer_go(fd);
	nanosleep(&two, NULL);
	drain_rest(fd);
}

/* A pool of 8 buffers, all 8 sent by reference and left unread for now. */
static struct smclo_pool *eight_sent(int fd)
{
	struct smclo_pool *p = smclo_pool_create(fd, BUF_SIZE, 8, 0);

	CHECK(p, "smclo_pool_create");
	handshake_pool(fd);
	for (int i = 0; i < 8; i++)
		pool_send(p, BUF_SIZE);
	return p;
}

static void shut_client(int fd)
{
	struct smclo_pool *p = eight_sent(fd);
	void *got[8];

	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	wait_all_notified(p);
	CHECK(t.reclaimed == 0, "%llu buffers came back reclaimed from a live reader",
	      (unsigned long long)t.reclaimed);
	for (int i = 0; i < 8; i++) {
		CHECK((got[i] = smclo_pool_get(p)) != NULL, "buffer %d back", i);
		memset(got[i], 0xee, BUF_SIZE);
	}
	report(fd, "");
	CHECK(smclo_pool_destroy(p) == 0, "destroy");
}

static void shut_server(int fd)
{
	struct timespec half = { 0, 500 * 1000 * 1000 };

	answer_go(fd);
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	nanosleep(&half, NULL);
	while (read_some(fd, UINT64_MAX - rpos))
		;
	CHECK(rpos == 2 + 8ull * BUF_SIZE, "read %llu bytes", (unsigned long long)rpos);
	printf("ok via=%s pool_peeks=%llu bytes=%llu\n", via_name(smclo_via(fd)),
	       (unsigned long long)pool_peeks, (unsigned long long)rpos);
}

static void shutkilled_client(int fd)
{
	struct smclo_pool *p = eight_sent(fd);

	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	wait_all_notified(p);
	CHECK(t.reclaimed == 8, "%llu of 8 buffers came back reclaimed",
	      (unsigned long long)t.reclaimed);
	report(fd, "");
	CHECK(smclo_pool_destroy(p) == 0, "destroy");
}

static void shutkilled_server(int fd)
{
	struct timespec half = { 0, 500 * 1000 * 1000 };

	answer_go(fd);
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	nanosleep(&half, NULL);         /* the client sends and shuts down meanwhile */
	printf("holding via=%s\n", via_name(smclo_via(fd)));
	fflush(stdout);
	kill(getpid(), SIGKILL);
}

static void closekilled_client(int fd)
{
	struct smclo_pool *p = eight_sent(fd);
	int via = smclo_via(fd);

	CHECK(close(fd) == 0, "close");
	wait_all_notified(p);
	CHECK(t.reclaimed == 8, "%llu of 8 buffers came back reclaimed",
	      (unsigned long long)t.reclaimed);
	printf("ok via=%s sent=%llu refs=%llu reclaimed=%llu\n", via_name(via),
	       (unsigned long long)t.sent, (unsigned long long)t.refs,
	       (unsigned long long)t.reclaimed);
	CHECK(smclo_pool_destroy(p) == 0, "destroy");
}

static const struct scenario scenarios[] = {
	{ "bulk", bulk_client, drain_server },
	{ "hold", hold_client, hold_server },
	{ "killed", killed_client, killed_server },
	{ "fork", fork_client, drain_server },
	{ "errors", errors_client, drain_server },
	{ "shut", shut_client, shut_server },
	{ "shutkilled", shutkilled_client, shutkilled_server },
	{ "closekilled", closekilled_client, shutkilled_server },
	{ "sndtimeo", sndtimeo_client, paused_server },
};

static void client_start(void)
{
	rng ^= 0x9e3779b97f4a7c15ull;   /* the two ends draw different sizes */
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);       /* a write after the server died: EPIPE */
	return scenario_main(argc, argv, "pool_peer", scenarios,
	                     sizeof(scenarios) / sizeof(scenarios[0]), client_start);
}
