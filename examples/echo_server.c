/*
 * echo_server.c - an echo server on smclo's native API.
 *
 *   echo_server PORT
 *
 * Serves one connection at a time on 127.0.0.1:PORT and sends every byte
 * back.  The bytes are never copied into a buffer of ours: each received
 * run is seen in place (smclo_recv_peek), copied once straight into claimed
 * send space (smclo_send_claim), published (smclo_send_commit) and only then
 * released (smclo_recv_consume).  With smclo carrying the connection, that
 * is one copy per byte from the client's ring into ours; on plain TCP the
 * same code runs, through the library's staging memory.
 *
 * Build: cc echo_server.c -lsmclo (or `make`, which builds it into
 * build/examples/).  Prints "ready" once listening.
 */
#include <smclo.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Copy @n bytes of @from (two pieces at most) into @to. */
static void copy_span(const struct smclo_span *to, const struct smclo_span *from, size_t n)
{
	size_t done = 0;

	for (int i = 0; i < 2 && done < n; i++) {
		const char *src = from->iov[i].iov_base;
		size_t left = from->iov[i].iov_len < n - done ? from->iov[i].iov_len : n - done;

		while (left) {
			/* where byte `done` goes in @to */
			int j = done < to->iov[0].iov_len ? 0 : 1;
			size_t at = j ? done - to->iov[0].iov_len : done;
			size_t k = to->iov[j].iov_len - at < left ? to->iov[j].iov_len - at : left;

			memcpy((char *)to->iov[j].iov_base + at, src, k);
			src += k;
			done += k;
			left -= k;
		}
	}
}

static int serve(int fd)
{
	struct smclo_span in, out;
	ssize_t n;

	while ((n = smclo_recv_peek(fd, 1, &in, 0)) > 0) {
		ssize_t room = smclo_send_claim(fd, 1, &out, 0);

		if (room < 0)
			return -1;
		if (room < n)
			n = room;       /* the rest stays for the next round */
		copy_span(&out, &in, (size_t)n);
		if (smclo_send_commit(fd, (size_t)n, 0) != n || smclo_recv_consume(fd, (size_t)n) < 0)
			return -1;
	}
	return n < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (argc != 2 || atoi(argv[1]) <= 0 || atoi(argv[1]) > 65535) {
		fprintf(stderr, "usage: echo_server PORT\n");
		return 2;
	}
	a.sin_port = htons((unsigned short)atoi(argv[1]));
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, 16) < 0) {
		perror("echo_server: listen");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int fd = accept(ls, NULL, NULL);

		if (fd < 0)
			continue;
		if (serve(fd) < 0)
			perror("echo_server: connection");
		close(fd);
	}
}
