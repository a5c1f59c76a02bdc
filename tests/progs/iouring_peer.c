/*
 * iouring_peer.c - an echo server that moves its bytes with io_uring.
 *
 *   iouring_peer PORT
 *
 * io_uring reads and writes the socket without going through libc, so smclo
 * must not accelerate this process's connections: they must work over TCP
 * and say "io_uring in use".  Serves one connection: echoes until EOF.
 */
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int ring_io(struct io_uring *ring, int fd, void *buf, size_t len, int write)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct io_uring_cqe *cqe;
	int res;

	if (write)
		io_uring_prep_send(sqe, fd, buf, len, 0);
	else
		io_uring_prep_recv(sqe, fd, buf, len, 0);
	io_uring_submit(ring);
	if (io_uring_wait_cqe(ring, &cqe) < 0)
		return -1;
	res = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return res;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct io_uring ring;
	static char buf[65536];
	int one = 1, l, fd, n;

	if (argc != 2) {
		fprintf(stderr, "usage: iouring_peer PORT\n");
		return 2;
	}
	if (io_uring_queue_init(8, &ring, 0) < 0) {
		perror("io_uring_queue_init");
		return 1;
	}
	a.sin_port = htons((uint16_t)atoi(argv[1]));
	l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (void *)&a, sizeof(a)) < 0 || listen(l, 8) < 0) {
		perror("listen");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	fd = accept(l, NULL, NULL);
	while ((n = ring_io(&ring, fd, buf, sizeof(buf), 0)) > 0)
		for (int off = 0; off < n;) {
			int w = ring_io(&ring, fd, buf + off, (size_t)(n - off), 1);
			if (w <= 0)
				return 1;
			off += w;
		}
	close(fd);
	return n < 0 ? 1 : 0;
}
