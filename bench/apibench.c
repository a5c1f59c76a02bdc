/*
 * apibench.c - the native API's benchmark rows (bench/api.py runs them).
 *
 *   apibench serve  ADDR WAY TEST SIZE          print "ready", serve one connection
 *   apibench client ADDR WAY TEST SIZE SECONDS  print one JSON line
 *
 * ADDR is a TCP port on 127.0.0.1, or a path for an AF_UNIX stream socket.
 * WAY is how both ends move bytes: "copy" (send()/recv() into the program's
 * own buffers, what every socket program does), "api" (claims written in
 * place, peeks read in place: include/smclo.h) or "pool" (bulk only: the
 * client fills buffers of a pool and sends them by reference, the server
 * peeks as "api"; buffers of the message's size up to POOL_PIECE, a larger
 * message going as several buffers, 4 of them - 16 for messages up to 64
 * KiB; 16 of 1 MiB ran at a quarter of 4's speed here, the buffers out of
 * the caches by the time they came round again) or "pool-whole" (as
 * "pool", but each message in one buffer of its size however large) or "keep"
 * (rate only: as "api", but one claim carries many messages, each committed
 * with SMCLO_KEEP as it is written).  TEST:
 *
 *   bulk      the client streams messages of SIZE bytes for SECONDS; the
 *             server reads every byte (a sum of 64-bit words: a benchmark
 *             that never touches the payload measures pointer passing, not
 *             transfer) and reports it at the end; the rate is bytes/s
 *   rate      the same with SIZE-byte messages, each with a 4-byte length
 *             header the server parses: messages/s
 *   pingpong  SIZE bytes to the server and back, one at a time: the round
 *             trip's median and 99th percentile in microseconds
 *
 * The client writes each message's payload (a counter) in place or into its
 * buffer; the server checks the sum over every byte it received against the
 * client's, so a run that lost or mangled bytes reports "bad".
 */
#include <smclo.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static int api;                 /* WAY is "api", "pool" or "keep" */
static int keep;                /* WAY is "keep" */
static struct smclo_pool *pool; /* WAY is "pool": the client's */
static size_t size;
static size_t pool_piece;       /* WAY is "pool": the pool's buffer size */

/*
 * The largest pool buffer of the "pool" way.  A pool's buffers are reused
 * while they are still in the caches when they are small enough: 4 of 1
 * MiB stay in this machine's 32 MiB L3 beside everything else, 4 of 16 MiB
 * do not and leave both ends working from memory (docs/api.md, "Choosing
 * buffer sizes").
 */
#define POOL_PIECE (1u << 20)

static void die(const char *what)
{
	fprintf(stderr, "apibench: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- moving bytes: one function per way and direction ------------------- */

static uint8_t *buf;            /* the copy way's own buffer */
#define BUF_MAX (32u << 20)
#define CONSUME_STEP (128u << 10)   /* what an in-place reader releases at a time */

/*
 * Sum of the bytes of @p: the reader touches every byte it gets.  As fast
 * as the machine can (SSE2's sum of absolute differences against zero adds
 * 16 bytes in two 64-bit lanes: ~18 GB/s here against ~4 GB/s for a word
 * at a time), so that the rows measure the transfer, not the summing
 * (bench/iceoryx2 sums the same way).  Other machines: eight at a time,
 * the byte pairs of a word added in four 16-bit lanes and one
 * multiplication adding the lanes, exactly, whatever the alignment.
 */
#if defined(__x86_64__)
static uint64_t sum_bytes(const uint8_t *p, size_t n)
{
	const __m128i zero = _mm_setzero_si128();
	__m128i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
	size_t i = 0;
	uint64_t s;

	for (; i + 64 <= n; i += 64) {
		a0 = _mm_add_epi64(a0, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i)), zero));
		a1 = _mm_add_epi64(a1, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i + 16)),
		                                    zero));
		a2 = _mm_add_epi64(a2, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i + 32)),
		                                    zero));
		a3 = _mm_add_epi64(a3, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i + 48)),
		                                    zero));
	}
	a0 = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
	s = (uint64_t)_mm_cvtsi128_si64(a0) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(a0, a0));
	for (; i < n; i++)
		s += p[i];
	return s;
}
#else
static uint64_t sum_bytes(const uint8_t *p, size_t n)
{
	const uint64_t m = 0x00ff00ff00ff00ffull;
	uint64_t s = 0;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t w, t;
		memcpy(&w, p + i, 8);
		t = (w & m) + ((w >> 8) & m);
		s += (t * 0x0001000100010001ull) >> 48;
	}
	for (; i < n; i++)
		s += p[i];
	return s;
}
#endif

/* A free buffer of the pool, waiting on its descriptor while none is. */
static void *pool_buffer(void)
{
	struct smclo_cqe c[32];
	void *b;

	while (!(b = smclo_pool_get(pool))) {
		struct pollfd p = { .fd = smclo_pool_fd(pool), .events = POLLIN };

		if (errno != ENOBUFS)
			die("pool get");
		if (poll(&p, 1, 10000) != 1)
			die("pool wait");
		while (smclo_reap(pool, c, 32) == 32)
			;
	}
	return b;
}

/* Write @n bytes of value @v (the payload the reader sums) and send them. */
static void put(int fd, uint8_t v, size_t n)
{
	while (pool && n) {
		void *b = pool_buffer();
		size_t k = n < pool_piece ? n : pool_piece;

		memset(b, v, k);
		if (smclo_pool_send(pool, b, k, 0, 0) != (ssize_t)k)
			die("pool send");
		n -= k;
	}
	while (n) {
		if (api) {
			struct smclo_span s;
			ssize_t got = smclo_send_claim(fd, 1, &s, 0);
			size_t k;

			if (got < 0)
				die("claim");
			k = (size_t)got < n ? (size_t)got : n;
			for (int i = 0, done = 0; i < 2 && (size_t)done < k; i++) {
				size_t m = s.iov[i].iov_len < k - (size_t)done ? s.iov[i].iov_len
				                                               : k - (size_t)done;
				memset(s.iov[i].iov_base, v, m);
				done += (int)m;
			}
			if (smclo_send_commit(fd, k, 0) != (ssize_t)k)
				die("commit");
			n -= k;
		} else {
			size_t k = n < BUF_MAX ? n : BUF_MAX;
			ssize_t w;

			memset(buf, v, k);
			for (size_t off = 0; off < k; off += (size_t)w)
				if ((w = send(fd, buf + off, k - off, MSG_NOSIGNAL)) <= 0)
					die("send");
			n -= k;
		}
	}
}

/*
 * Receive up to @max bytes (at least @min unless the stream ends), summing
 * them into *@sum; returns the count, 0 at the end.
 */
static size_t take(int fd, size_t min, size_t max, uint64_t *sum)
{
	if (api) {
		struct smclo_span s;
		ssize_t n = smclo_recv_peek(fd, min, &s, 0);
		size_t k, done = 0;

		if (n <= 0) {
			if (n < 0)
				die("peek");
			return 0;
		}
		/* process and release in pieces: the writer refills the ring
		 * behind a reader that reads in place only as fast as it consumes */
		k = (size_t)n < max ? (size_t)n : max;
		if (k > CONSUME_STEP)
			k = CONSUME_STEP;
		for (int i = 0; i < 2 && done < k; i++) {
			size_t m = s.iov[i].iov_len < k - done ? s.iov[i].iov_len : k - done;
			*sum += sum_bytes(s.iov[i].iov_base, m);
			done += m;
		}
		if (smclo_recv_consume(fd, k) < 0)
			die("consume");
		return k;
	}
	size_t got = 0;
	while (got < min || got == 0) {
		ssize_t r = recv(fd, buf + got, max - got, 0);
		if (r < 0)
			die("recv");
		if (r == 0)
			break;
		got += (size_t)r;
	}
	*sum += sum_bytes(buf, got);
	return got;
}

/* ---- the tests ---------------------------------------------------------- */

struct result {
	uint64_t bytes, msgs, sum;
};

/* Byte @i of the two pieces of @v. */
static uint8_t byte_of(const struct iovec v[2], size_t i)
{
	return i < v[0].iov_len ? ((uint8_t *)v[0].iov_base)[i]
	                        : ((uint8_t *)v[1].iov_base)[i - v[0].iov_len];
}

/* Sum of bytes [@from, @to) of the two pieces of @v. */
static uint64_t sum_of(const struct iovec v[2], size_t from, size_t to)
{
	uint64_t s = 0;

	if (from < v[0].iov_len) {
		size_t e = to < v[0].iov_len ? to : v[0].iov_len;
		s += sum_bytes((uint8_t *)v[0].iov_base + from, e - from);
		from = e;
	}
	if (from < to)
		s += sum_bytes((uint8_t *)v[1].iov_base + (from - v[0].iov_len), to - from);
	return s;
}

/*
 * Parse the whole messages at the start of @v (@n bytes: a 4-byte length,
 * then the payload), summing payloads into @r.  Returns the bytes they
 * take, and in *@need what the next message needs in all (0: unknown yet).
 */
static size_t parse(const struct iovec v[2], size_t n, struct result *r, size_t *need)
{
	size_t at = 0;

	for (;;) {
		uint32_t len;

		if (n - at < 4) {
			*need = 4;
			return at;
		}
		len = (uint32_t)byte_of(v, at) | (uint32_t)byte_of(v, at + 1) << 8 |
		      (uint32_t)byte_of(v, at + 2) << 16 | (uint32_t)byte_of(v, at + 3) << 24;
		if (n - at - 4 < len) {
			*need = 4 + (size_t)len;
			return at;
		}
		r->sum += sum_of(v, at + 4, at + 4 + len);
		r->bytes += len;
		r->msgs++;
		at += 4 + len;
	}
}

/*
 * Server of rate: messages parsed where they lie - in the peer's ring
 * (api), or in our buffer after recv() (copy), each read taking as much as
 * is there, as an event-driven server does.
 */
static void serve_messages(int fd, struct result *r)
{
	size_t have = 0, need = 4;

	for (;;) {
		if (api) {
			struct smclo_span s;
			ssize_t n = smclo_recv_peek(fd, need, &s, 0);
			size_t used;

			if (n < 0)
				die("peek");
			if (n == 0)
				return;
			used = parse(s.iov, (size_t)n, r, &need);
			if (smclo_recv_consume(fd, used) < 0)
				die("consume");
			continue;
		}
		ssize_t k = recv(fd, buf + have, BUF_MAX - have, 0);
		struct iovec v[2] = { { buf, 0 }, { NULL, 0 } };
		size_t used;

		if (k < 0)
			die("recv");
		if (k == 0)
			return;
		have += (size_t)k;
		v[0].iov_len = have;
		used = parse(v, have, r, &need);
		memmove(buf, buf + used, have - used);
		have -= used;
	}
}

/* Server of bulk and rate: read everything, answer the totals. */
static void serve_stream(int fd, int framed)
{
	struct result r = { 0 };

	if (framed) {
		serve_messages(fd, &r);
	} else {
		size_t n;
		while ((n = take(fd, 1, api ? SIZE_MAX : BUF_MAX, &r.sum)))
			r.bytes += n;
	}
	if (send(fd, &r, sizeof(r), 0) != sizeof(r))
		die("send result");
}

/*
 * One message of the "keep" way: into the claim this client keeps (a new
 * one when the old has no room for it), committed with SMCLO_KEEP.
 */
static struct smclo_span kept;
static size_t kept_at;

static void put_kept(int fd, const uint8_t h[4], uint8_t v)
{
	if (kept.len - kept_at < 4 + size) {
		if (kept.len && smclo_send_commit(fd, 0, 0) < 0)
			die("end of claim");
		if (smclo_send_claim(fd, 4 + size, &kept, 0) < 0)
			die("claim");
		kept_at = 0;
	}
	if (kept_at + 4 + size <= kept.iov[0].iov_len) {
		uint8_t *p = (uint8_t *)kept.iov[0].iov_base + kept_at;   /* one piece */
		memcpy(p, h, 4);
		memset(p + 4, v, size);
		kept_at += 4 + size;
	} else {
		for (size_t i = 0; i < 4 + size; i++, kept_at++) {
			size_t j = kept_at < kept.iov[0].iov_len ? 0 : 1;
			size_t at = j ? kept_at - kept.iov[0].iov_len : kept_at;
			((uint8_t *)kept.iov[j].iov_base)[at] = i < 4 ? h[i] : v;
		}
	}
	if (smclo_send_commit(fd, 4 + size, SMCLO_KEEP) != (ssize_t)(4 + size))
		die("commit");
}

static void client_stream(int fd, int framed, double secs)
{
	struct result mine = { 0 }, theirs;
	double t0 = now(), t1;
	uint8_t v = 0;

	do {
		for (int k = 0; k < 64; k++, v++) {
			if (framed) {
				uint8_t h[4] = { (uint8_t)size, (uint8_t)(size >> 8),
				                 (uint8_t)(size >> 16), (uint8_t)(size >> 24) };
				if (keep) {
					put_kept(fd, h, v);
				} else if (api) {
					struct smclo_span s;
					if (smclo_send_claim(fd, 4 + size, &s, 0) < 0)
						die("claim");
					/* header and payload in one claim: one commit per message */
					uint8_t *p = s.iov[0].iov_base;
					if (s.iov[0].iov_len >= 4 + size) {
						memcpy(p, h, 4);
						memset(p + 4, v, size);
					} else {
						for (size_t i = 0; i < 4 + size; i++) {
							size_t j = i < s.iov[0].iov_len ? 0 : 1;
							size_t at = j ? i - s.iov[0].iov_len : i;
							((uint8_t *)s.iov[j].iov_base)[at] = i < 4 ? h[i] : v;
						}
					}
					if (smclo_send_commit(fd, 4 + size, 0) != (ssize_t)(4 + size))
						die("commit");
				} else {
					memcpy(buf, h, 4);
					memset(buf + 4, v, size);
					if (send(fd, buf, 4 + size, MSG_NOSIGNAL) != (ssize_t)(4 + size))
						die("send");
				}
			} else {
				put(fd, v, size);
			}
			mine.sum += (uint64_t)v * size;
			mine.bytes += size;
			mine.msgs++;
		}
	} while ((t1 = now()) - t0 < secs);
	if (keep && kept.len && smclo_send_commit(fd, 0, 0) < 0)
		die("end of claim");
	shutdown(fd, SHUT_WR);
	size_t got = 0;
	while (got < sizeof(theirs)) {
		ssize_t r = recv(fd, (char *)&theirs + got, sizeof(theirs) - got, 0);
		if (r <= 0) {
			errno = r ? errno : ECONNRESET;
			die("result");
		}
		got += (size_t)r;
	}
	t1 = now();
	printf("{\"bytes\": %llu, \"msgs\": %llu, \"seconds\": %.4f, \"ok\": %s}\n",
	       (unsigned long long)theirs.bytes, (unsigned long long)theirs.msgs, t1 - t0,
	       theirs.bytes == mine.bytes && theirs.sum == mine.sum &&
	       (!framed || theirs.msgs == mine.msgs) ? "true" : "false");
}

static void serve_pingpong(int fd)
{
	uint64_t sum = 0;

	for (;;) {
		size_t got = 0, n;
		while (got < size && (n = take(fd, size - got, size - got, &sum)))
			got += n;
		if (got < size)
			break;
		put(fd, (uint8_t)sum, size);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void client_pingpong(int fd, double secs)
{
	size_t cap = 1 << 22, n = 0;
	double *rtt = malloc(cap * sizeof(*rtt)), t0 = now(), t;
	uint64_t sum = 0;

	if (!rtt)
		die("malloc");
	do {
		double a = now();
		size_t got = 0, k;

		put(fd, (uint8_t)n, size);
		while (got < size && (k = take(fd, size - got, size - got, &sum)))
			got += k;
		if (got < size)
			die("short answer");
		t = now();
		if (n < cap)
			rtt[n++] = t - a;
	} while (t - t0 < secs);
	qsort(rtt, n, sizeof(*rtt), cmp_double);
	printf("{\"round_trips\": %zu, \"seconds\": %.4f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
	       "\"ok\": true}\n", n, t - t0, rtt[n / 2] * 1e6, rtt[n * 99 / 100] * 1e6);
	shutdown(fd, SHUT_WR);
}

/* ---- sockets ------------------------------------------------------------ */

static int is_port(const char *addr)
{
	return strspn(addr, "0123456789") == strlen(addr);
}

static socklen_t address(const char *addr, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (is_port(addr)) {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)atoi(addr));
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		return sizeof(*a);
	}
	struct sockaddr_un *u = (struct sockaddr_un *)ss;
	u->sun_family = AF_UNIX;
	snprintf(u->sun_path, sizeof(u->sun_path), "%s", addr);
	return sizeof(*u);
}

static void nodelay(int fd, const char *addr)
{
	int one = 1;

	if (is_port(addr))
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int main(int argc, char **argv)
{
	struct sockaddr_storage ss;
	socklen_t len;
	const char *test;
	int fd;

	if (argc < 6 || (strcmp(argv[1], "serve") && strcmp(argv[1], "client")) ||
	    (strcmp(argv[3], "copy") && strcmp(argv[3], "api") && strcmp(argv[3], "pool") &&
	     strcmp(argv[3], "pool-whole") && strcmp(argv[3], "keep")) ||
	    (!strncmp(argv[3], "pool", 4) && strcmp(argv[4], "bulk")) ||
	    (!strcmp(argv[3], "keep") && strcmp(argv[4], "rate")) ||
	    (!strcmp(argv[1], "client") && argc != 7)) {
		fprintf(stderr, "usage: apibench serve ADDR WAY bulk|rate|pingpong SIZE\n"
		                "       apibench client ADDR WAY bulk|rate|pingpong SIZE SECONDS\n"
		                "WAY: copy|api|pool|pool-whole|keep (pool, pool-whole: bulk only; "
		                "keep: rate only)\n");
		return 2;
	}
	api = strcmp(argv[3], "copy") != 0;
	keep = !strcmp(argv[3], "keep");
	test = argv[4];
	size = strtoul(argv[5], NULL, 0);
	if (!size || size > BUF_MAX - 4) {
		fprintf(stderr, "apibench: SIZE must be 1 to %u\n", BUF_MAX - 4);
		return 2;
	}
	if (!(buf = malloc(BUF_MAX)))
		die("malloc");
	len = address(argv[2], &ss);
	fd = socket(ss.ss_family, SOCK_STREAM, 0);
	if (!strcmp(argv[1], "serve")) {
		int one = 1, c;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (!is_port(argv[2]))
			unlink(argv[2]);
		if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 4) < 0)
			die("listen");
		printf("ready\n");
		fflush(stdout);
		if ((c = accept(fd, NULL, NULL)) < 0)
			die("accept");
		nodelay(c, argv[2]);
		if (!strcmp(test, "pingpong"))
			serve_pingpong(c);
		else
			serve_stream(c, !strcmp(test, "rate"));
		return 0;
	}
	if (connect(fd, (struct sockaddr *)&ss, len) < 0)
		die("connect");
	nodelay(fd, argv[2]);
	pool_piece = !strcmp(argv[3], "pool") && size > POOL_PIECE ? POOL_PIECE : size;
	if (!strncmp(argv[3], "pool", 4) &&
	    !(pool = smclo_pool_create(fd, pool_piece, pool_piece <= (64u << 10) ? 16 : 4, 0)))
		die("pool create");
	if (!strcmp(test, "pingpong"))
		client_pingpong(fd, atof(argv[6]));
	else
		client_stream(fd, !strcmp(test, "rate"), atof(argv[6]));
	return 0;
}
