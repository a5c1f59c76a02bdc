/*
 * api_peer.c - one end of a connection driven through the native API
 * (include/smclo.h), for tests/py/test_api.py.
 *
 *   api_peer serve   HOST PORT SCENARIO    listen, print "ready", take one connection
 *   api_peer connect HOST PORT SCENARIO
 *
 * Each scenario has a server half and a client half.  Every byte of the
 * stream is a function of its offset (pattern()), so whichever calls wrote
 * or read it, the reader checks each one where it sits.  Each end prints
 * "ok via=ring|copy" and its figures on success, "FAIL ..." and exits 1
 * otherwise.
 *
 *   bulk     8 MiB client to server: claims of 1..48 KiB filled in place and
 *            committed (some only in part), peeks of varying minimum consumed
 *            in varying parts; the server answers the byte count; reports
 *            how many claims and peeks wrapped around the ring
 *   mixed    claim/commit, write, send, writev interleaved against
 *            peek/consume, read, recv, readv
 *   abort    aborted claims and empty commits leave nothing in the stream
 *   errors   EINVAL, EDEADLK, EAGAIN, EMSGSIZE, ENOTSOCK, ENOTCONN
 *   eof      peek asks for more than comes before a shutdown: fewer, then 0
 *   fork     a fork child cannot commit its parent's claim; the parent can
 *   full     a server that does not read: claims with SMCLO_DONTWAIT end in
 *            EAGAIN; then it reads all of it
 *   close    a thread closes while holding a claim and a peek: no hang
 *   thread-exit  a thread exits holding a claim: given up, nothing sent
 *   keep     4 MiB client to server, each claim carrying many messages of
 *            1..2000 bytes committed one by one with SMCLO_KEEP (across the
 *            ring's wrap), ended by a commit of 0 or an abort
 *   killed-reader  the server dies (SIGKILL) holding a peek while the client
 *            waits in a claim of a full stream: EPIPE or ECONNRESET
 *   killed-writer  the client dies holding a claim while the server waits
 *            in a peek for more than was committed: those bytes, then the end
 *   big-peek 16 MiB written with write() against a server whose peeks ask
 *            for nearly the whole ring and consume 50000 bytes at a time:
 *            the writer waits for room while the reader waits for more, so
 *            the reader must give the writer its room before it waits (it
 *            hung for ever); blocking peeks, then SMCLO_DONTWAIT peeks
 *            with poll()
 */
#include "smclo.h"
#include "scenario.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define BULK_BYTES (8u << 20)


static uint8_t pattern(uint64_t off)
{
	return (uint8_t)((off * 131u) ^ (off >> 9) ^ (off >> 17));
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

/* ---- writing and checking the pattern ----------------------------------- */

static uint64_t wpos, rpos;     /* stream offsets written, read */

static void fill_span(const struct smclo_span *s, size_t n)
{
	for (int i = 0; i < 2 && n; i++) {
		size_t k = s->iov[i].iov_len < n ? s->iov[i].iov_len : n;
		uint8_t *p = s->iov[i].iov_base;

		for (size_t j = 0; j < k; j++)
			p[j] = pattern(wpos++);
		n -= k;
	}
}

static void check_bytes(const uint8_t *p, size_t n, const char *how)
{
	for (size_t j = 0; j < n; j++, rpos++)
		CHECK(p[j] == pattern(rpos), "%s: byte %llu is %u, expected %u", how,
		      (unsigned long long)rpos, p[j], pattern(rpos));
}

static void check_span(const struct smclo_span *s, size_t n)
{
	CHECK(s->iov[0].iov_len + s->iov[1].iov_len == s->len, "span pieces do not add up");
	for (int i = 0; i < 2 && n; i++) {
		size_t k = s->iov[i].iov_len < n ? s->iov[i].iov_len : n;

		check_bytes(s->iov[i].iov_base, k, "peek");
		n -= k;
	}
}

static const char *via_name(int via)
{
	return via == SMCLO_VIA_RING ? "ring" : via == SMCLO_VIA_COPY ? "copy" : "?";
}

/* Send @n pattern bytes through claim/commit; returns 1 if the claim wrapped. */
static int send_claimed(int fd, size_t n, int *via)
{
	struct smclo_span s;
	ssize_t got = smclo_send_claim(fd, n, &s, 0);

	CHECK(got >= (ssize_t)n && (size_t)got == s.len, "claim of %zu gave %zd", n, got);
	*via = s.via;
	fill_span(&s, n);
	CHECK(smclo_send_commit(fd, n, 0) == (ssize_t)n, "commit of %zu", n);
	return s.iov[1].iov_len > 0;
}

/* Read through peek/consume until @n bytes came; returns the peeks that wrapped. */
static int recv_peeked(int fd, size_t n, size_t max_min, int *via)
{
	int wraps = 0;

	while (n) {
		struct smclo_span s;
		size_t min = 1 + rnd((uint32_t)(n < max_min ? n : max_min));
		ssize_t got = smclo_recv_peek(fd, min, &s, 0);
		size_t take;

		CHECK(got >= (ssize_t)min, "peek of %zu gave %zd", min, got);
		*via = s.via;
		wraps += s.iov[1].iov_len > 0;
		take = (size_t)got < n ? (size_t)got : n;
		take = 1 + rnd((uint32_t)take);         /* consume a part, see the rest again */
		check_span(&s, take);
		CHECK(smclo_recv_consume(fd, take) == 0, "consume of %zu", take);
		n -= take;
	}
	return wraps;
}



/* ---- scenarios ---------------------------------------------------------- */

static void bulk_client(int fd)
{
	int via = 0, wraps = 0;
	uint64_t echo;

	while (wpos < BULK_BYTES) {
		size_t n = 1 + rnd(48 << 10);
		if (n > BULK_BYTES - wpos)
			n = BULK_BYTES - wpos;
		wraps += send_claimed(fd, n, &via);
	}
	read_exact(fd, &echo, sizeof(echo));
	CHECK(echo == BULK_BYTES, "server counted %llu", (unsigned long long)echo);
	printf("ok via=%s wraps=%d\n", via_name(via), wraps);
}

/* Fill @n pattern bytes at offset @at of the span (across its two pieces). */
static void fill_span_at(const struct smclo_span *s, size_t at, size_t n)
{
	for (size_t j = 0; j < n; j++, at++) {
		uint8_t *p = at < s->iov[0].iov_len ? (uint8_t *)s->iov[0].iov_base + at
		                                    : (uint8_t *)s->iov[1].iov_base + at - s->iov[0].iov_len;
		*p = pattern(wpos++);
	}
}

static void keep_client(int fd)
{
	int via = 0, wraps = 0;
	uint64_t echo, msgs = 0;

	while (wpos < BULK_BYTES / 2) {
		struct smclo_span s;
		ssize_t got = smclo_send_claim(fd, 1, &s, 0);
		size_t at = 0;

		CHECK(got > 0, "claim");
		via = s.via;
		wraps += s.iov[1].iov_len > 0;
		while (at < (size_t)got && wpos < BULK_BYTES / 2) {
			size_t n = 1 + rnd(2000);
			ssize_t r;

			if (n > (size_t)got - at)
				n = (size_t)got - at;
			if (n > BULK_BYTES / 2 - wpos)
				n = BULK_BYTES / 2 - wpos;
			fill_span_at(&s, at, n);
			r = smclo_send_commit(fd, n, SMCLO_KEEP);
			CHECK(r == (ssize_t)n, "commit of %zu kept gave %zd", n, r);
			at += n;
			msgs++;
			if (rnd(50) == 0)
				break;          /* the rest of this claim unused */
		}
		/* end it: a commit of nothing, or an abort */
		if (rnd(2))
			CHECK(smclo_send_commit(fd, 0, 0) == 0, "final commit");
		else
			CHECK(smclo_send_abort(fd) == 0, "abort");
		CHECK(smclo_send_commit(fd, 0, 0) < 0 && errno == EINVAL, "claim ended");
	}
	read_exact(fd, &echo, sizeof(echo));
	CHECK(echo == BULK_BYTES / 2, "server counted %llu", (unsigned long long)echo);
	printf("ok via=%s wraps=%d msgs=%llu\n", via_name(via), wraps, (unsigned long long)msgs);
}

static void keep_server(int fd)
{
	int via = 0, wraps = recv_peeked(fd, BULK_BYTES / 2, 40 << 10, &via);
	uint64_t n = BULK_BYTES / 2;

	write_all(fd, &n, sizeof(n));
	printf("ok via=%s wraps=%d\n", via_name(via), wraps);
}

static void bulk_server(int fd)
{
	int via = 0, wraps = recv_peeked(fd, BULK_BYTES, 40 << 10, &via);
	uint64_t n = rpos;

	write_all(fd, &n, sizeof(n));
	printf("ok via=%s wraps=%d\n", via_name(via), wraps);
}

#define MIXED_ROUNDS 400

static void mixed_client(int fd)
{
	int via = 0;
	uint8_t buf[9000];

	for (int r = 0; r < MIXED_ROUNDS; r++) {
		size_t n = 1 + rnd(sizeof(buf));

		if (r % 4 == 0) {
			send_claimed(fd, n, &via);
			continue;
		}
		for (size_t j = 0; j < n; j++)
			buf[j] = pattern(wpos + j);
		wpos += n;
		if (r % 4 == 1) {
			write_all(fd, buf, n);
		} else if (r % 4 == 2) {
			CHECK(send(fd, buf, n, 0) == (ssize_t)n, "send");
		} else {
			struct iovec v[2] = { { buf, n / 2 }, { buf + n / 2, n - n / 2 } };
			CHECK(writev(fd, v, 2) == (ssize_t)n, "writev");
		}
	}
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	printf("ok via=%s bytes=%llu\n", via_name(via), (unsigned long long)wpos);
}

static void mixed_server(int fd)
{
	int via = 0;
	uint8_t buf[7000];

	for (int r = 0;; r++) {
		ssize_t n;

		if (r % 3 == 0) {
			struct smclo_span s;
			n = smclo_recv_peek(fd, 1, &s, 0);
			CHECK(n >= 0, "peek");
			if (n == 0)
				break;
			via = s.via;
			n = 1 + rnd((uint32_t)n);
			check_span(&s, (size_t)n);
			CHECK(smclo_recv_consume(fd, (size_t)n) == 0, "consume");
			continue;
		}
		if (r % 3 == 1) {
			n = read(fd, buf, 1 + rnd(sizeof(buf)));
		} else if (r % 2) {
			n = recv(fd, buf, 1 + rnd(sizeof(buf)), 0);
		} else {
			struct iovec v[2] = { { buf, 100 }, { buf + 100, sizeof(buf) - 100 } };
			n = readv(fd, v, 2);
		}
		CHECK(n >= 0, "read");
		if (n == 0)
			break;
		check_bytes(buf, (size_t)n, "read");
	}
	printf("ok via=%s bytes=%llu\n", via_name(via), (unsigned long long)rpos);
}

static void abort_client(int fd)
{
	struct smclo_span s;
	int via = 0;

	for (int r = 0; r < 50; r++) {
		size_t n = 1 + rnd(30000);
		ssize_t got = smclo_send_claim(fd, n, &s, 0);

		CHECK(got >= (ssize_t)n, "claim");
		memset(s.iov[0].iov_base, 0xee, s.iov[0].iov_len);     /* never sent */
		if (r % 3 == 0) {
			CHECK(smclo_send_abort(fd) == 0, "abort");
		} else if (r % 3 == 1) {
			CHECK(smclo_send_commit(fd, 0, 0) == 0, "empty commit");
		} else {
			/* a second claim replaces the first */
			CHECK(smclo_send_claim(fd, 1, &s, 0) >= 1, "second claim");
			CHECK(smclo_send_abort(fd) == 0, "abort of the second");
		}
		CHECK(smclo_send_abort(fd) == -1 && errno == EINVAL, "abort with no claim");
		send_claimed(fd, n, &via);
	}
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	printf("ok via=%s\n", via_name(via));
}

static void drain_server(int fd)
{
	struct smclo_span s;
	int via = 0;
	ssize_t n;

	while ((n = smclo_recv_peek(fd, 0, &s, 0)) > 0) {
		via = s.via;
		check_span(&s, (size_t)n);
		CHECK(smclo_recv_consume(fd, (size_t)n) == 0, "consume");
	}
	CHECK(n == 0, "peek to the end");
	CHECK(s.len == 0, "span at the end");
	printf("ok via=%s bytes=%llu\n", via_name(via), (unsigned long long)rpos);
}

static void errors_client(int fd)
{
	struct smclo_span s;
	char go = 0;
	int plain = socket(AF_INET, SOCK_STREAM, 0);
	int pipefd[2];

	CHECK(smclo_send_claim(fd, 1, NULL, 0) == -1 && errno == EINVAL, "NULL span");
	CHECK(smclo_send_claim(fd, 1, &s, 0x100) == -1 && errno == EINVAL, "unknown flag");
	CHECK(smclo_send_claim(fd, SMCLO_STAGE_MAX + 1ul, &s, 0) == -1 && errno == EMSGSIZE,
	      "claim beyond the largest");
	CHECK(smclo_send_commit(fd, 1, 0) == -1 && errno == EINVAL, "commit without claim");
	CHECK(smclo_recv_consume(fd, 0) == -1 && errno == EINVAL, "consume without peek");
	CHECK(pipe(pipefd) == 0, "pipe");
	CHECK(smclo_send_claim(pipefd[1], 1, &s, 0) == -1 && errno == ENOTSOCK, "a pipe");
	CHECK(smclo_via(pipefd[0]) == -1 && errno == ENOTSOCK, "via of a pipe");
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pipefd) == 0, "socketpair");
	CHECK(smclo_via(pipefd[0]) == -1 && errno == EOPNOTSUPP, "via of an AF_UNIX socket");
	CHECK(smclo_send_claim(plain, 1, &s, 0) == -1 && errno == ENOTCONN, "unconnected");
	CHECK(smclo_send_claim(-1, 1, &s, 0) == -1 && errno == EBADF, "fd -1");
	/* a claim held: this thread's own write would wait for itself */
	CHECK(smclo_send_claim(fd, 10, &s, 0) >= 10, "claim");
	if (s.via == SMCLO_VIA_RING)
		CHECK(write(fd, "x", 1) == -1 && errno == EDEADLK, "write during a claim");
	CHECK(smclo_send_commit(fd, s.len + 1, 0) == -1 && errno == EINVAL, "commit beyond");
	fill_span(&s, 10);
	CHECK(smclo_send_commit(fd, 10, 0) == 10, "commit");
	read_exact(fd, &go, 1);         /* the server checked EAGAIN on an empty stream */
	send_claimed(fd, 100, &(int){ 0 });
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	printf("ok via=%s\n", via_name(s.via));
}

static void errors_server(int fd)
{
	struct smclo_span s;
	char b;
	int via = smclo_via(fd);

	/* the first 10 bytes, then nothing until we say go */
	CHECK(smclo_recv_peek(fd, 10, &s, 0) >= 10, "peek 10");
	check_span(&s, 10);
	if (via == SMCLO_VIA_RING)
		CHECK(read(fd, &b, 1) == -1 && errno == EDEADLK, "read during a peek");
	CHECK(smclo_recv_consume(fd, s.len + 1) == -1 && errno == EINVAL, "consume beyond");
	CHECK(smclo_recv_consume(fd, 10) == 0, "consume");
	CHECK(smclo_recv_peek(fd, 1, &s, SMCLO_DONTWAIT) == -1 && errno == EAGAIN,
	      "dontwait on an empty stream");
	CHECK(smclo_recv_peek(fd, SMCLO_STAGE_MAX + 1ul, &s, 0) == -1 && errno == EMSGSIZE,
	      "peek beyond the largest");
	write_all(fd, "g", 1);
	drain_server(fd);
}

static void eof_client(int fd)
{
	int via;

	send_claimed(fd, 1000, &via);
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	printf("ok via=%s\n", via_name(via));
}

static void eof_server(int fd)
{
	struct smclo_span s;
	ssize_t n = smclo_recv_peek(fd, 5000, &s, 0);

	CHECK(n == 1000, "peek of 5000 before a shutdown after 1000 gave %zd", n);
	check_span(&s, 1000);
	CHECK(smclo_recv_consume(fd, 1000) == 0, "consume");
	CHECK(smclo_recv_peek(fd, 1, &s, 0) == 0, "peek at the end");
	CHECK(smclo_recv_peek(fd, 1, &s, SMCLO_DONTWAIT) == 0, "dontwait peek at the end");
	printf("ok via=%s\n", via_name(s.via));
}

static void fork_client(int fd)
{
	struct smclo_span s;
	int via = 0, st;
	pid_t pid;

	CHECK(smclo_send_claim(fd, 500, &s, 0) >= 500, "claim");
	fill_span(&s, 500);
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		/* the claim is the parent thread's: the child has none */
		if (smclo_send_commit(fd, 500, 0) >= 0 || errno != EINVAL)
			_exit(3);
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "the child committed its parent's claim (status %d)", st);
	CHECK(smclo_send_commit(fd, 500, 0) == 500, "commit after the fork");
	send_claimed(fd, 700, &via);
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	printf("ok via=%s\n", via_name(via));
}

static void full_client(int fd)
{
	struct smclo_span s;
	int via = smclo_via(fd), rounds = 0;
	char go;


	for (;; rounds++) {
		ssize_t n = smclo_send_claim(fd, 4096, &s, SMCLO_DONTWAIT);

		if (n < 0) {
			CHECK(errno == EAGAIN, "claim on a full stream");
			break;
		}
		CHECK(rounds < 100000, "never full");
		fill_span(&s, 4096);
		CHECK(smclo_send_commit(fd, 4096, 0) == 4096, "commit");
	}
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	CHECK(read(fd, &go, 1) == 0, "end from the server");
	printf("ok via=%s filled=%llu\n", via_name(via), (unsigned long long)wpos);
}

static void full_server(int fd)
{
	sleep(1);               /* not reading: the client fills the stream */
	drain_server(fd);
	shutdown(fd, SHUT_WR);
}

static void close_client(int fd)
{
	struct smclo_span s;
	char go;

	send_claimed(fd, 300, &(int){ 0 });
	read_exact(fd, &go, 1);         /* the server holds its peek of them */
	CHECK(smclo_send_claim(fd, 10, &s, 0) >= 10, "claim");
	CHECK(close(fd) == 0, "close while holding a claim");
	CHECK(smclo_send_commit(fd, 10, 0) == -1, "commit after the close");
	printf("ok\n");
}

static void close_server(int fd)
{
	struct smclo_span s;
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	ssize_t n = smclo_recv_peek(fd, 300, &s, 0);

	CHECK(n >= 300, "peek");
	check_span(&s, 300);
	/* the other direction is free while we hold the peek */
	write_all(fd, "g", 1);
	CHECK(poll(&p, 1, 10000) == 1, "the client's close");
	CHECK(close(fd) == 0, "close while holding a peek");
	(void)smclo_recv_consume(fd, 300);      /* whatever it says, it returns */
	printf("ok\n");
}

/* The server holds a peek and dies: the client, blocked in a claim of a
 * full stream, hears of it. */
static void killed_reader_client(int fd)
{
	struct smclo_span s;
	ssize_t n;

	send_claimed(fd, 100, &(int){ 0 });
	while ((n = smclo_send_claim(fd, 4096, &s, 0)) > 0) {
		fill_span(&s, 4096);
		CHECK(smclo_send_commit(fd, 4096, 0) == 4096 || errno == EPIPE || errno == ECONNRESET,
		      "commit");
	}
	CHECK(errno == EPIPE || errno == ECONNRESET, "claim after the reader died");
	printf("ok error=%s\n", errno == EPIPE ? "EPIPE" : "ECONNRESET");
}

static void killed_reader_server(int fd)
{
	struct smclo_span s;

	CHECK(smclo_recv_peek(fd, 100, &s, 0) >= 100, "peek");
	sleep(1);                       /* the client fills the stream meanwhile */
	raise(SIGKILL);
}

/* The client holds a claim and dies: the server, waiting in a peek for more
 * than was committed, gets what was and then the end. */
static void killed_writer_client(int fd)
{
	struct smclo_span s;

	send_claimed(fd, 1000, &(int){ 0 });
	CHECK(smclo_send_claim(fd, 5000, &s, 0) >= 5000, "claim");
	memset(s.iov[0].iov_base, 0xee, s.iov[0].iov_len);
	usleep(300000);                 /* the server waits in its peek */
	raise(SIGKILL);
}

static void killed_writer_server(int fd)
{
	struct smclo_span s;
	ssize_t n = smclo_recv_peek(fd, 4000, &s, 0);

	CHECK(n == 1000 || (n == -1 && errno == ECONNRESET),
	      "peek of 4000 when the writer died after 1000 gave %zd", n);
	if (n == 1000) {
		check_span(&s, 1000);
		CHECK(smclo_recv_consume(fd, 1000) == 0, "consume");
		n = smclo_recv_peek(fd, 1, &s, 0);
		CHECK(n == 0 || (n == -1 && errno == ECONNRESET), "after the bytes: %zd", n);
	}
	printf("ok end=%s\n", n == 0 ? "eof" : "reset");
}

/* A thread claims and exits without committing: its claim is given up, and
 * nothing of it is sent; the others write on. */
static void *claim_and_exit(void *arg)
{
	struct smclo_span s;
	int fd = *(int *)arg;

	if (smclo_send_claim(fd, 100, &s, 0) < 100)
		return (void *)1;
	memset(s.iov[0].iov_base, 0xee, s.iov[0].iov_len);
	return NULL;
}

static void thread_exit_client(int fd)
{
	pthread_t t;
	void *r;
	uint8_t b[10];
	int via;

	CHECK(pthread_create(&t, NULL, claim_and_exit, &fd) == 0, "pthread_create");
	CHECK(pthread_join(t, &r) == 0 && r == NULL, "the claiming thread");
	send_claimed(fd, 50, &via);
	for (int i = 0; i < 10; i++)
		b[i] = pattern(wpos++);
	write_all(fd, b, sizeof(b));
	CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	printf("ok via=%s\n", via_name(via));
}


#define BIG_PEEK_BYTES (16u << 20)
#define BIG_PEEK_MIN 1000000u      /* of a 1 MiB ring */

static void big_peek_client(int fd)
{
	static uint8_t b[64 << 10];
	int via = smclo_via(fd);
	char c;

	while (wpos < BIG_PEEK_BYTES) {
		for (size_t i = 0; i < sizeof(b); i++)
			b[i] = pattern(wpos++);
		write_all(fd, b, sizeof(b));
	}
	shutdown(fd, SHUT_WR);
	CHECK(read(fd, &c, 1) == 0, "the server's end");
	printf("ok via=%s bytes=%llu\n", via_name(via), (unsigned long long)wpos);
}

static void big_peek_server(int fd)
{
	int dontwait_peeks = 0, via = 0;

	while (rpos < BIG_PEEK_BYTES) {
		uint64_t left = BIG_PEEK_BYTES - rpos;
		size_t min = left < BIG_PEEK_MIN ? (size_t)left : BIG_PEEK_MIN;
		int dontwait = rpos >= BIG_PEEK_BYTES / 2;      /* the second half */
		struct smclo_span s;
		ssize_t got = smclo_recv_peek(fd, min, &s, dontwait ? SMCLO_DONTWAIT : 0);
		size_t take;

		if (got < 0 && dontwait && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLIN };

			dontwait_peeks++;
			CHECK(poll(&p, 1, 10000) >= 0, "poll");
			continue;
		}
		CHECK(got >= (ssize_t)min, "peek of %zu gave %zd after %llu bytes", min, got,
		      (unsigned long long)rpos);
		take = (size_t)got < 50000 ? (size_t)got : 50000;
		via = s.via;
		check_span(&s, take);
		CHECK(smclo_recv_consume(fd, take) == 0, "consume of %zu", take);
	}
	shutdown(fd, SHUT_WR);
	printf("ok via=%s bytes=%llu dontwait_peeks=%d\n", via_name(via),
	       (unsigned long long)rpos, dontwait_peeks);
}

static const struct scenario scenarios[] = {
	{ "bulk", bulk_client, bulk_server },
	{ "mixed", mixed_client, mixed_server },
	{ "abort", abort_client, drain_server },
	{ "errors", errors_client, errors_server },
	{ "eof", eof_client, eof_server },
	{ "fork", fork_client, drain_server },
	{ "full", full_client, full_server },
	{ "close", close_client, close_server },
	{ "killed-reader", killed_reader_client, killed_reader_server },
	{ "killed-writer", killed_writer_client, killed_writer_server },
	{ "thread-exit", thread_exit_client, drain_server },
	{ "keep", keep_client, keep_server },
	{ "big-peek", big_peek_client, big_peek_server },
};

static void client_start(void)
{
	rng ^= 0x9e3779b97f4a7c15ull;   /* the two ends draw different sizes */
}

int main(int argc, char **argv)
{
	return scenario_main(argc, argv, "api_peer", scenarios,
	                     sizeof(scenarios) / sizeof(scenarios[0]), client_start);
}
