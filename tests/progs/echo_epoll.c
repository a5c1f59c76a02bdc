/*
 * echo_epoll - a single-threaded, level-triggered epoll echo server: the
 * long-lived server of the churn and soak tests (tests/py/test_churn.py).
 * It allocates nothing per connection beyond a fixed buffer, so whatever
 * its descriptor count or memory map gains over a run is smclo's.
 *
 *   echo_epoll PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static char buf[1 << 16];

/* Echo what is there; 1 when the connection is done. */
static int echo(int c)
{
	ssize_t n = recv(c, buf, sizeof(buf), MSG_DONTWAIT);

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		return 1;
	for (ssize_t off = 0; n > 0 && off < n;) {
		ssize_t w = send(c, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
		if (w < 0 && errno == EAGAIN)
			continue;       /* the client reads as it writes: a moment */
		if (w < 0)
			return 1;
		off += w;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct epoll_event ev = { .events = EPOLLIN }, evs[64];
	int l, ep, one = 1;

	if (argc != 2) {
		fprintf(stderr, "usage: echo_epoll PORT\n");
		return 2;
	}
	a.sin_port = htons((uint16_t)atoi(argv[1]));
	l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 256) < 0) {
		perror("listen");
		return 1;
	}
	ep = epoll_create1(EPOLL_CLOEXEC);
	ev.data.fd = l;
	epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);

		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;

			if (fd == l) {
				int c = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (c >= 0) {
					ev.data.fd = c;
					epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
				}
			} else if (echo(fd)) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
			}
		}
	}
}
