/*
 * bulk_sender.c - send a stream of bytes with smclo's native API and read
 * it back from an echo server, checking every byte.
 *
 *   bulk_sender PORT MIB [pool]
 *
 * Sends MIB mebibytes to 127.0.0.1:PORT by writing them straight into
 * claimed send space (smclo_send_claim / smclo_send_commit) - or, with
 * "pool", into the buffers of a buffer pool sent by reference
 * (smclo_pool_get / smclo_pool_send, buffers back through smclo_reap when
 * the descriptor of smclo_pool_fd says so) - and reads the echo in place
 * (smclo_recv_peek / smclo_recv_consume), from two threads so that neither
 * direction waits for the other.  Prints how the bytes travelled (ring or
 * copy), the rate, and "match" if every byte came back; with "pool", how
 * many sends went by reference and how many were copied.
 *
 * Build: cc bulk_sender.c -lsmclo -lpthread (or `make`).
 */
#include <smclo.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define POOL_BUFS 8
#define POOL_BUF  (256u << 10)

static int fd, use_pool;
static uint64_t total, by_reference, copied;

static uint8_t byte_at(uint64_t off)
{
	return (uint8_t)(off * 7 + (off >> 11));
}

static void *sender(void *arg)
{
	struct smclo_span s;
	uint64_t off = 0;

	while (off < total) {
		ssize_t n = smclo_send_claim(fd, 1, &s, 0);

		if (n < 0) {
			perror("bulk_sender: claim");
			exit(1);
		}
		if ((uint64_t)n > total - off)
			n = (ssize_t)(total - off);
		for (int i = 0, done = 0; i < 2; i++) {
			uint8_t *p = s.iov[i].iov_base;
			for (size_t j = 0; j < s.iov[i].iov_len && done < n; j++, done++)
				p[j] = byte_at(off + (uint64_t)done);
		}
		if (smclo_send_commit(fd, (size_t)n, 0) != n) {
			perror("bulk_sender: commit");
			exit(1);
		}
		off += (uint64_t)n;
	}
	shutdown(fd, SHUT_WR);
	return arg;
}

/* Count the notifications: a buffer's bytes read in place, or copied. */
static void reap(struct smclo_pool *p)
{
	struct smclo_cqe c[16];
	int n;

	while ((n = smclo_reap(p, c, 16)) > 0)
		for (int i = 0; i < n; i++) {
			if (!(c[i].flags & SMCLO_CQE_F_NOTIF))
				continue;       /* the request's: its bytes are on their way */
			if (c[i].flags & (SMCLO_CQE_F_COPIED | SMCLO_CQE_F_KERNEL))
				copied += c[i].count;
			else
				by_reference += c[i].count;
		}
}

/* The same stream from a buffer pool: fill a buffer, send it, and wait on
 * the pool's descriptor when every buffer is out. */
static void *pool_sender(void *arg)
{
	struct smclo_pool *p = smclo_pool_create(fd, POOL_BUF, POOL_BUFS, 0);
	uint64_t off = 0;

	if (!p) {
		perror("bulk_sender: smclo_pool_create");
		exit(1);
	}
	while (off < total) {
		uint8_t *b = smclo_pool_get(p);
		size_t n = total - off < POOL_BUF ? (size_t)(total - off) : POOL_BUF;

		if (!b) {
			struct pollfd pfd = { .fd = smclo_pool_fd(p), .events = POLLIN };

			poll(&pfd, 1, -1);      /* a buffer comes back, or the peer goes */
			reap(p);
			continue;
		}
		for (size_t j = 0; j < n; j++)
			b[j] = byte_at(off + j);
		if (smclo_pool_send(p, b, n, off, 0) != (ssize_t)n) {
			perror("bulk_sender: smclo_pool_send");
			exit(1);
		}
		off += n;
	}
	shutdown(fd, SHUT_WR);
	/* every notification: the echo is all read, so the peer read them all */
	while (by_reference + copied < (total + POOL_BUF - 1) / POOL_BUF) {
		struct pollfd pfd = { .fd = smclo_pool_fd(p), .events = POLLIN };

		poll(&pfd, 1, 1000);
		reap(p);
	}
	smclo_pool_destroy(p);
	return arg;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct smclo_span s;
	struct timespec t0, t1;
	uint64_t off = 0;
	int via = 0, bad = 0;
	pthread_t t;
	ssize_t n;

	if (argc < 3 || argc > 4 || atoi(argv[1]) <= 0 || atoi(argv[2]) <= 0 ||
	    (argc == 4 && strcmp(argv[3], "pool"))) {
		fprintf(stderr, "usage: bulk_sender PORT MIB [pool]\n");
		return 2;
	}
	use_pool = argc == 4;
	a.sin_port = htons((unsigned short)atoi(argv[1]));
	total = (uint64_t)atoi(argv[2]) << 20;
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		perror("bulk_sender: connect");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_create(&t, NULL, use_pool ? pool_sender : sender, NULL);
	while ((n = smclo_recv_peek(fd, 1, &s, 0)) > 0) {
		via = s.via;
		for (int i = 0, done = 0; i < 2; i++) {
			const uint8_t *p = s.iov[i].iov_base;
			for (size_t j = 0; j < s.iov[i].iov_len; j++, done++)
				bad |= p[j] != byte_at(off + (uint64_t)done);
		}
		off += (uint64_t)n;
		smclo_recv_consume(fd, (size_t)n);
	}
	pthread_join(t, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (use_pool)
		printf("by-reference=%llu copied=%llu ", (unsigned long long)by_reference,
		       (unsigned long long)copied);
	printf("via=%s bytes=%llu %.0f MiB/s %s\n", via == SMCLO_VIA_RING ? "ring" : "copy",
	       (unsigned long long)off, (double)off / (1 << 20) / secs,
	       off == total && !bad && n == 0 ? "match" : "MISMATCH");
	return off == total && !bad && n == 0 ? 0 : 1;
}
