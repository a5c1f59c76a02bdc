/*
 * scenario.h - what the native API's scenario programs share (api_peer.c,
 * pool_peer.c; api_hazards.c uses the failure helpers): failing with a
 * message, whole writes and reads, and a main() that runs one half of a
 * named scenario over one TCP connection:
 *
 *   PROG serve   HOST PORT SCENARIO    listen, print "ready", take one connection
 *   PROG connect HOST PORT SCENARIO
 *
 * Header-only (static functions): each program is one file plus this.
 */
#ifndef SMCLO_TEST_SCENARIO_H
#define SMCLO_TEST_SCENARIO_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *role = "?";

/* Print "FAIL <role>: ..." with errno and exit 1. */
__attribute__((format(printf, 1, 2), noreturn, unused))
static void failf(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL %s: ", role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (errno %s)\n", strerror(errno));
	fflush(stdout);
	exit(1);
}

#define CHECK(cond, ...) do { if (!(cond)) failf(__VA_ARGS__); } while (0)

__attribute__((unused))
static void write_all(int fd, const void *b, size_t n)
{
	while (n) {
		ssize_t w = write(fd, b, n);
		CHECK(w > 0, "write");
		b = (const char *)b + w;
		n -= (size_t)w;
	}
}

__attribute__((unused))
static void read_exact(int fd, void *b, size_t n)
{
	while (n) {
		ssize_t r = read(fd, b, n);
		CHECK(r > 0, "read (got %zd)", r);
		b = (char *)b + r;
		n -= (size_t)r;
	}
}

struct scenario {
	const char *name;
	void (*client)(int fd);
	void (*server)(int fd);
};

__attribute__((unused))
static int listen_on(const char *host, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1, "address %s", host);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind");
	CHECK(listen(fd, 8) == 0, "listen");
	return fd;
}

__attribute__((unused))
static int connect_to(const char *host, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1, "address %s", host);
	CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "connect");
	return fd;
}

/*
 * main() of a scenario program: run the half of @argv[4] (one of the @n
 * @scenarios) that @argv[1] names; @client_start runs first in a client
 * (the two ends draw different random sizes).
 */
__attribute__((unused))
static int scenario_main(int argc, char **argv, const char *prog, const struct scenario *scenarios,
                         size_t n, void (*client_start)(void))
{
	const struct scenario *sc = NULL;
	int fd;

	if (argc != 5) {
		fprintf(stderr, "usage: %s serve|connect HOST PORT SCENARIO\n", prog);
		return 2;
	}
	for (size_t i = 0; i < n; i++)
		if (!strcmp(argv[4], scenarios[i].name))
			sc = &scenarios[i];
	if (!sc) {
		fprintf(stderr, "%s: no scenario %s\n", prog, argv[4]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	role = argv[1];
	if (!strcmp(argv[1], "serve")) {
		int ls = listen_on(argv[2], atoi(argv[3]));

		printf("ready\n");
		fd = accept(ls, NULL, NULL);
		CHECK(fd >= 0, "accept");
		sc->server(fd);
	} else if (!strcmp(argv[1], "connect")) {
		fd = connect_to(argv[2], atoi(argv[3]));
		if (client_start)
			client_start();
		sc->client(fd);
	} else {
		fprintf(stderr, "%s: serve or connect, not %s\n", prog, argv[1]);
		return 2;
	}
	return 0;
}

#endif
