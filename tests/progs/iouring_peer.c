/*
 * iouring_peer.c - an echo server of one connection that uses io_uring
 * (through liburing, as programs do) in one of four ways:
 *
 *   iouring_peer PORT files    io_uring reads a file for every message; the
 *                              socket goes through libc (MariaDB's way):
 *                              accelerated, nothing moves
 *   iouring_peer PORT socket   every read and write of the socket through
 *                              io_uring, the first after the client's bytes
 *                              are in the ring: the connection goes to TCP
 *                              first, those bytes answered from the ring
 *   iouring_peer PORT poll     an io_uring POLL_ADD for the first bytes, then
 *                              libc: the poll completes for the ring's bytes
 *   iouring_peer PORT fixed    the socket registered as a fixed file before
 *                              any byte came (a greeting "hi\n" first), then
 *                              fixed-file reads and writes
 *
 * Echoes until EOF; exit status 0 when every call did what it should.
 * Two more print what their completions said, to compare with the kernel's
 * own answers on plain TCP (test_io_uring.py runs both):
 *
 *   iouring_peer PORT chain    reads of 1000 bytes, each linked to a write
 *                              of them to a file, until one is short (the
 *                              kernel cancels the write behind it)
 *   iouring_peer PORT sendclose  reads the request with libc to its end, then
 *                              one batch: a send of the request back, linked
 *                              to a close of the socket
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct io_uring ring;

static int complete(void)
{
	struct io_uring_cqe *cqe;
	int res;

	io_uring_submit(&ring);
	if (io_uring_wait_cqe(&ring, &cqe) < 0)
		return -1;
	res = cqe->res;
	io_uring_cqe_seen(&ring, cqe);
	return res;
}

/* One read or write of @fd (a fixed file index if @fixed) through io_uring. */
static int ring_io(int fd, void *buf, size_t len, int write, int fixed)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

	if (write)
		io_uring_prep_send(sqe, fd, buf, len, 0);
	else
		io_uring_prep_recv(sqe, fd, buf, len, 0);
	if (fixed)
		sqe->flags |= IOSQE_FIXED_FILE;
	return complete();
}

/* A file read through io_uring, as a database reads its pages. */
static int file_read(int file)
{
	char page[4096];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

	io_uring_prep_read(sqe, file, page, sizeof(page), 0);
	return complete() > 0 ? 0 : -1;
}

static int echo_ring(int fd, int fixed)
{
	static char buf[65536];
	int n;

	while ((n = ring_io(fd, buf, sizeof(buf), 0, fixed)) > 0)
		for (int off = 0; off < n;) {
			int w = ring_io(fd, buf + off, (size_t)(n - off), 1, fixed);
			if (w <= 0)
				return 1;
			off += w;
		}
	return n < 0;
}

static int echo_libc(int fd, int file)
{
	static char buf[65536];
	ssize_t n;

	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		if (file >= 0 && file_read(file) < 0)
			return 1;
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(fd, buf + off, (size_t)(n - off));
			if (w <= 0)
				return 1;
			off += w;
		}
	}
	return n < 0;
}

/* Submit what is queued and print each completion (user_data, result). */
static void complete_all(int n)
{
	struct io_uring_cqe *cqe;

	io_uring_submit(&ring);
	for (int i = 0; i < n && io_uring_wait_cqe(&ring, &cqe) == 0; i++) {
		printf("cqe %llu %d\n", (unsigned long long)cqe->user_data, cqe->res);
		io_uring_cqe_seen(&ring, cqe);
	}
}

static int chain(int fd)
{
	static char buf[1000];
	FILE *f = tmpfile();
	int out = f ? fileno(f) : -1;

	for (int round = 0; round < 8 && out >= 0; round++) {
		struct io_uring_sqe *rd = io_uring_get_sqe(&ring), *wr = io_uring_get_sqe(&ring);

		io_uring_prep_read(rd, fd, buf, sizeof(buf), 0);
		rd->flags |= IOSQE_IO_LINK;
		rd->user_data = 1;
		io_uring_prep_write(wr, out, buf, sizeof(buf), -1);
		wr->user_data = 2;
		complete_all(2);
	}
	printf("file %ld\n", out >= 0 ? (long)lseek(out, 0, SEEK_END) : -1L);
	return 0;
}

static int send_close(int fd)
{
	static char buf[1 << 20];
	struct io_uring_sqe *sqe;
	ssize_t n, got = 0;

	while (got < (ssize_t)sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - (size_t)got)) > 0)
		got += n;
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_send(sqe, fd, buf, (size_t)got, 0);
	sqe->flags |= IOSQE_IO_LINK;
	sqe->user_data = 1;
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_close(sqe, fd);
	sqe->user_data = 2;
	complete_all(2);
	return 0;
}

static int serve(int fd, const char *mode)
{
	struct io_uring_sqe *sqe;

	if (strcmp(mode, "files") == 0)
		return echo_libc(fd, open("/proc/self/exe", O_RDONLY));
	if (strcmp(mode, "fixed") == 0) {
		if (io_uring_register_files(&ring, &fd, 1) < 0)
			return 1;
		return ring_io(0, "hi\n", 3, 1, 1) != 3 || echo_ring(0, 1);
	}
	if (strcmp(mode, "sendclose") == 0)
		return send_close(fd);
	usleep(300 * 1000);     /* the client's first bytes are in the ring now */
	if (strcmp(mode, "chain") == 0)
		return chain(fd);
	if (strcmp(mode, "socket") == 0)
		return echo_ring(fd, 0);
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	if (!(complete() & POLLIN))
		return 1;
	return echo_libc(fd, -1);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1, l, fd, rc;

	if (argc != 3) {
		fprintf(stderr, "usage: iouring_peer PORT files|socket|poll|fixed|chain|sendclose\n");
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
	rc = serve(fd, argv[2]);
	if (strcmp(argv[2], "sendclose") != 0)
		close(fd);
	io_uring_queue_exit(&ring);
	if (rc)
		fprintf(stderr, "iouring_peer %s: failed\n", argv[2]);
	return rc;
}
