/*
 * stress.c - stream integrity under every way of using a socket.
 *
 *   stress server PORT lt|et|oneshot      epoll echo server (non-blocking)
 *   stress client PORT THREADS CONNS SEED  verifying clients
 *
 * Each client connection sends a pseudo-random stream (random total length,
 * random write sizes split over several iovecs), half-closes, and checks
 * that the echo it reads back (with random read sizes, MSG_PEEK and
 * MSG_WAITALL mixed in) is byte for byte the same.  Connections alternate
 * between blocking (a writer thread beside the reader) and non-blocking
 * (poll-driven), and every fifth one is written partly by a forked child.
 * Prints "conns=N mismatches=M bytes=B" and exits 1 on any mismatch.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- server ------------------------------------------------------------- */

struct peer {
	int fd;
	char *buf;
	size_t len, cap;
	int eof;
};

static int mode_et, mode_oneshot;

static void arm(int ep, struct peer *p, int op)
{
	struct epoll_event ev = { .data.ptr = p };

	ev.events = EPOLLIN | EPOLLRDHUP | (p->len ? EPOLLOUT : 0);
	if (mode_et)
		ev.events |= EPOLLET | EPOLLOUT;
	if (mode_oneshot)
		ev.events |= EPOLLONESHOT;
	epoll_ctl(ep, op, p->fd, &ev);
}

static int flush(struct peer *p)
{
	while (p->len) {
		ssize_t n = send(p->fd, p->buf, p->len, MSG_NOSIGNAL);
		if (n < 0)
			return errno == EAGAIN ? 0 : -1;
		memmove(p->buf, p->buf + n, p->len - (size_t)n);
		p->len -= (size_t)n;
	}
	return 0;
}

/* Returns -1 when the peer is finished with. */
static int serve(struct peer *p)
{
	for (;;) {
		if (p->cap - p->len < 65536) {
			p->cap = p->cap * 2 + 65536;
			p->buf = realloc(p->buf, p->cap);
		}
		if (p->eof)
			break;
		ssize_t n = recv(p->fd, p->buf + p->len, p->cap - p->len, 0);
		if (n > 0) {
			p->len += (size_t)n;
			if (p->len > (4 << 20) && flush(p) < 0)
				return -1;
			if (p->len > (4 << 20))
				break;   /* let the client read before we take more */
			continue;
		}
		if (n == 0)
			p->eof = 1;
		else if (errno != EAGAIN)
			return -1;
		break;
	}
	if (flush(p) < 0)
		return -1;
	if (p->eof && p->len == 0) {
		shutdown(p->fd, SHUT_WR);      /* half-close back: the client reads EOF */
		return -1;
	}
	return 0;
}

static int run_server(int port, const char *mode)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct epoll_event evs[64];
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), ep = epoll_create1(0);

	mode_et = !strcmp(mode, "et");
	mode_oneshot = !strcmp(mode, "oneshot");
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (void *)&a, sizeof(a)) < 0 || listen(l, 512) < 0) {
		perror("server");
		return 1;
	}
	struct epoll_event lev = { .events = EPOLLIN, .data.ptr = NULL };
	epoll_ctl(ep, EPOLL_CTL_ADD, l, &lev);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		for (int i = 0; i < n; i++) {
			struct peer *p = evs[i].data.ptr;
			if (!p) {
				int fd = accept4(l, NULL, NULL, SOCK_NONBLOCK);
				if (fd < 0)
					continue;
				p = calloc(1, sizeof(*p));
				p->fd = fd;
				arm(ep, p, EPOLL_CTL_ADD);
				continue;
			}
			if (serve(p) < 0) {
				epoll_ctl(ep, EPOLL_CTL_DEL, p->fd, NULL);
				close(p->fd);   /* after our half-close the client closes too */
				free(p->buf);
				free(p);
			} else {
				arm(ep, p, EPOLL_CTL_MOD);
			}
		}
	}
}

/* ---- client ------------------------------------------------------------- */

static int port;
static int conns_per_thread;
static _Atomic long mismatches, bytes_total, conns_done;

static uint8_t stream_byte(uint64_t seed, uint64_t i)
{
	uint64_t x = seed ^ (i / 8) * 0x9e3779b97f4a7c15ull;
	x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 29;
	return (uint8_t)(x >> (8 * (i % 8)));
}

static void fill(uint64_t seed, uint64_t off, uint8_t *b, size_t n)
{
	for (size_t k = 0; k < n; k++)
		b[k] = stream_byte(seed, off + k);
}

struct writer {
	int fd;
	uint64_t seed, from, to;
	unsigned rnd;
	int nonblock;
};

/* Write stream bytes [from, to) in random sizes as 1-3 iovecs. */
static int write_range(struct writer *w)
{
	uint8_t buf[3][40000];
	uint64_t off = w->from;

	while (off < w->to) {
		struct iovec iov[3];
		int n = 1 + rand_r(&w->rnd) % 3;
		size_t total = 0;
		for (int k = 0; k < n; k++) {
			size_t len = 1 + (size_t)(rand_r(&w->rnd) % (k ? 40000 : 20000));
			if (len > w->to - off - total)
				len = w->to - off - total;
			fill(w->seed, off + total, buf[k], len);
			iov[k].iov_base = buf[k];
			iov[k].iov_len = len;
			total += len;
			if (off + total == w->to) {
				n = k + 1;
				break;
			}
		}
		ssize_t r = writev(w->fd, iov, n);
		if (r < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = w->fd, .events = POLLOUT };
			poll(&p, 1, 1000);
			continue;
		}
		if (r <= 0) {
			perror("writev");
			return -1;
		}
		off += (uint64_t)r;
	}
	return 0;
}

static void *writer_thread(void *arg)
{
	struct writer *w = arg;

	if (write_range(w) == 0)
		shutdown(w->fd, SHUT_WR);
	return NULL;
}

/* Read until EOF, comparing against the stream; returns bytes or -1. */
static long read_verify(int fd, uint64_t seed, unsigned *rnd, int nonblock)
{
	static __thread uint8_t buf[70000], want[70000];
	uint64_t off = 0;

	for (;;) {
		size_t len = 1 + (size_t)(rand_r(rnd) % sizeof(buf));
		int flags = 0, r = rand_r(rnd) % 10;
		if (r == 0)
			flags = MSG_PEEK;
		else if (r == 1 && !nonblock)
			flags = MSG_WAITALL;
		ssize_t n = recv(fd, buf, len, flags);
		if (n < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			poll(&p, 1, 1000);
			continue;
		}
		if (n < 0) {
			perror("recv");
			return -1;
		}
		if (n == 0)
			return (long)off;
		fill(seed, off, want, (size_t)n);
		if (memcmp(buf, want, (size_t)n) != 0) {
			fprintf(stderr, "mismatch at offset %llu\n", (unsigned long long)off);
			return -1;
		}
		if (!(flags & MSG_PEEK))
			off += (uint64_t)n;
	}
}

static int dial(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (connect(fd, (void *)&a, sizeof(a)) < 0) {
		perror("connect");
		close(fd);
		return -1;
	}
	return fd;
}

static void one_connection(unsigned *rnd, int index)
{
	uint64_t seed = ((uint64_t)rand_r(rnd) << 32) | (uint64_t)rand_r(rnd);
	uint64_t total = (uint64_t)(rand_r(rnd) % (3 << 20));
	int nonblock = index % 2, forked = index % 5 == 4;
	struct writer w = { .seed = seed, .from = 0, .to = total, .rnd = (unsigned)seed };
	pthread_t t;
	long got;
	int fd = dial();

	if (fd < 0) {
		mismatches++;
		return;
	}
	w.fd = fd;
	w.nonblock = nonblock;
	if (nonblock)
		fcntl(fd, F_SETFL, O_NONBLOCK);
	if (forked) {
		/* a child writes the first half, then the parent goes on */
		pid_t pid = fork();
		if (pid == 0) {
			w.to = total / 2;
			_exit(write_range(&w) ? 1 : 0);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			mismatches++;
			close(fd);
			return;
		}
		w.from = total / 2;
		w.to = total;
	}
	pthread_create(&t, NULL, writer_thread, &w);
	got = read_verify(fd, seed, rnd, nonblock);
	pthread_join(t, NULL);
	if (got != (long)total) {
		fprintf(stderr, "conn %d: got %ld of %llu bytes\n", index, got,
		        (unsigned long long)total);
		mismatches++;
	}
	bytes_total += (long)total;
	conns_done++;
	close(fd);
}

static void *client_thread(void *arg)
{
	unsigned rnd = (unsigned)(uintptr_t)arg;

	for (int i = 0; i < conns_per_thread; i++)
		one_connection(&rnd, i);
	return NULL;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc == 4 && !strcmp(argv[1], "server"))
		return run_server(atoi(argv[2]), argv[3]);
	if (argc != 6 || strcmp(argv[1], "client")) {
		fprintf(stderr, "usage: stress server PORT lt|et|oneshot\n"
		                "       stress client PORT THREADS CONNS SEED\n");
		return 2;
	}
	port = atoi(argv[2]);
	int threads = atoi(argv[3]);
	conns_per_thread = atoi(argv[4]);
	unsigned seed = (unsigned)atoi(argv[5]);
	pthread_t t[64];
	for (int i = 0; i < threads && i < 64; i++)
		pthread_create(&t[i], NULL, client_thread, (void *)(uintptr_t)(seed + i * 7919));
	for (int i = 0; i < threads && i < 64; i++)
		pthread_join(t[i], NULL);
	printf("conns=%ld mismatches=%ld bytes=%ld\n", (long)conns_done, (long)mismatches,
	       (long)bytes_total);
	return mismatches ? 1 : 0;
}
