/*
 * api_hazards.c - the native API where it went wrong once: one focused check
 * per behaviour, each on a connection inside this process (both ends ours:
 * a ring under smclo, a plain TCP pair with SMCLO_DISABLE=1).
 *
 *   api_hazards CHECK      exit 0 and print "ok via=ring|copy", or "FAIL ..."
 *
 * Checks (each failed before its fix, found by an attack on the API):
 *   fionread      FIONREAD while this thread holds a peek: no self-deadlock
 *   dontwait      a peek, read, claim or write that may not wait gets EAGAIN
 *                 at once while another thread holds the direction
 *   close-slot    closing held descriptors frees the thread's hold slots
 *   stale         a hold on a closed descriptor whose number a new
 *                 connection got: its commit or consume reaches nothing
 *   rcvtimeo      a peek waiting for more bytes honours SO_RCVTIMEO
 *   signal        a peek interrupted by a SA_RESTART handler goes on; by
 *                 another, EINTR
 *   shutwr        shutdown(SHUT_WR) leaves this thread's peek alone
 *   destructor    the API used from a thread-exit destructor after the
 *                 API's own table was freed
 *   claim-restart a claim waiting on a full ring goes on after a SA_RESTART
 *                 signal
 */
#include "smclo.h"
#include "scenario.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>


static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A connected pair inside this process: *c the client's end, *s the server's. */
static void pair(int *c, int *s)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(l, 4) == 0, "listen");
	getsockname(l, (struct sockaddr *)&a, &al);
	*c = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(*c, (struct sockaddr *)&a, sizeof(a)) == 0, "connect");
	*s = accept(l, NULL, NULL);
	CHECK(*s >= 0, "accept");
	close(l);
}

static void put(int fd, const char *text)
{
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write %s", text);
}

static int via;

static void check_fionread(void)
{
	struct smclo_span sp;
	int c, s, n = 0;

	pair(&c, &s);
	put(c, "hello");
	CHECK(smclo_recv_peek(s, 5, &sp, 0) == 5, "peek");
	via = sp.via;
	alarm(5);
	CHECK(ioctl(s, FIONREAD, &n) == 0 && n == 5, "FIONREAD during a peek: %d", n);
	CHECK(smclo_recv_consume(s, 5) == 0, "consume");
}

/* ---- another thread holds a direction ---------------------------------- */

static int held_fd;
static pthread_mutex_t go_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go_cond = PTHREAD_COND_INITIALIZER;
static int holding;

static void *hold_for_a_while(void *arg)
{
	struct smclo_span sp;
	int tx = arg != NULL;

	CHECK((tx ? smclo_send_claim(held_fd, 1, &sp, 0) : smclo_recv_peek(held_fd, 1, &sp, 0)) > 0,
	      "the holder's %s", tx ? "claim" : "peek");
	pthread_mutex_lock(&go_lock);
	holding = 1;
	pthread_cond_signal(&go_cond);
	pthread_mutex_unlock(&go_lock);
	usleep(1500 * 1000);
	CHECK((tx ? smclo_send_abort(held_fd) : smclo_recv_consume(held_fd, 0)) == 0, "release");
	return NULL;
}

static void while_held(int fd, int tx, void (*try)(int fd))
{
	pthread_t t;

	held_fd = fd;
	holding = 0;
	pthread_create(&t, NULL, hold_for_a_while, tx ? (void *)1 : NULL);
	pthread_mutex_lock(&go_lock);
	while (!holding)
		pthread_cond_wait(&go_cond, &go_lock);
	pthread_mutex_unlock(&go_lock);
	try(fd);
	pthread_join(t, NULL);
}

static void try_rx(int fd)
{
	struct smclo_span sp;
	char b[8];
	double t0 = now();

	CHECK(smclo_recv_peek(fd, 1, &sp, SMCLO_DONTWAIT) == -1 && errno == EAGAIN,
	      "a DONTWAIT peek while another thread peeks");
	CHECK(recv(fd, b, sizeof(b), MSG_DONTWAIT) == -1 && errno == EAGAIN,
	      "a MSG_DONTWAIT recv while another thread peeks");
	CHECK(now() - t0 < 0.5, "the calls that may not wait waited %.2f s", now() - t0);
}

static void try_tx(int fd)
{
	struct smclo_span sp;
	double t0 = now();

	CHECK(smclo_send_claim(fd, 1, &sp, SMCLO_DONTWAIT) == -1 && errno == EAGAIN,
	      "a DONTWAIT claim while another thread claims");
	CHECK(send(fd, "x", 1, MSG_DONTWAIT) == -1 && errno == EAGAIN,
	      "a MSG_DONTWAIT send while another thread claims");
	CHECK(now() - t0 < 0.5, "the calls that may not wait waited %.2f s", now() - t0);
}

static void check_dontwait(void)
{
	int c, s;

	pair(&c, &s);
	via = smclo_via(s);
	put(c, "data");
	if (via == SMCLO_VIA_RING) {
		/* on TCP a hold holds nothing (smclo.h): nothing to wait for */
		while_held(s, 0, try_rx);
		while_held(c, 1, try_tx);
	}
}

static void check_close_slot(void)
{
	struct smclo_span sp;

	for (int round = 0; round < 12; round++) {
		int c, s;

		pair(&c, &s);
		put(c, "abc");
		CHECK(smclo_recv_peek(s, 3, &sp, 0) == 3, "peek, round %d", round);
		CHECK(smclo_send_claim(c, 1, &sp, 0) > 0, "claim, round %d", round);
		via = sp.via;
		close(s);
		close(c);
	}
}

static void check_stale(void)
{
	struct smclo_span sp;
	char b[16] = { 0 };
	int c, s, c2, s2, old;

	pair(&c, &s);
	CHECK(smclo_send_claim(c, 6, &sp, 0) >= 6, "claim");
	via = sp.via;
	memcpy(sp.iov[0].iov_base, "SECRET", 6);
	old = c;
	close(c);
	close(s);
	pair(&c2, &s2);         /* takes the numbers just closed */
	CHECK(c2 == old || s2 == old, "the new connection did not reuse number %d", old);
	CHECK(smclo_send_commit(old, 6, 0) == -1 && errno == EINVAL,
	      "a commit of a claim made on a closed descriptor");
	CHECK(smclo_recv_consume(old, 0) == -1 && errno == EINVAL, "a consume without a peek");
	put(c2, "new");
	CHECK(read(s2, b, sizeof(b)) == 3 && !strcmp(b, "new"), "the new connection read '%s'", b);
}

static void check_rcvtimeo(void)
{
	struct smclo_span sp;
	struct timeval tv = { .tv_usec = 200000 };
	double t0;
	int c, s;

	pair(&c, &s);
	via = smclo_via(s);
	put(c, "0123456789");
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0, "SO_RCVTIMEO");
	alarm(5);
	t0 = now();
	CHECK(smclo_recv_peek(s, 100, &sp, 0) == -1 && errno == EAGAIN,
	      "a peek for 100 with 10 there and SO_RCVTIMEO 200 ms");
	CHECK(now() - t0 >= 0.15 && now() - t0 < 2, "it took %.2f s", now() - t0);
}

static void on_signal(int sig)
{
	(void)sig;
}

static int signal_fd;

static void *write_late(void *arg)
{
	static char b[100];

	(void)arg;
	usleep(600 * 1000);
	CHECK(write(signal_fd, b, sizeof(b) - 10) == sizeof(b) - 10, "the late write");
	return NULL;
}

static void peek_through_signal(int restart)
{
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = restart ? SA_RESTART : 0 };
	struct itimerval it = { .it_value = { .tv_usec = 200000 } };
	struct smclo_span sp;
	pthread_t t;
	ssize_t n;
	int c, s;

	pair(&c, &s);
	via = smclo_via(s);
	put(c, "0123456789");
	signal_fd = c;
	sigaction(SIGALRM, &sa, NULL);
	pthread_create(&t, NULL, write_late, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	n = smclo_recv_peek(s, 100, &sp, 0);
	if (restart)
		CHECK(n == 100, "a peek through a SA_RESTART signal gave %zd", n);
	else
		CHECK(n == -1 && errno == EINTR, "a peek through another signal gave %zd", n);
	if (n > 0)
		smclo_recv_consume(s, 0);
	pthread_join(t, NULL);
	close(c);
	close(s);
}

static void check_signal(void)
{
	peek_through_signal(1);
	peek_through_signal(0);
}

static void check_shutwr(void)
{
	struct smclo_span sp;
	char b[8] = { 0 };
	int c, s;

	pair(&c, &s);
	put(c, "REQ1REQ2");
	CHECK(smclo_recv_peek(s, 8, &sp, 0) >= 4, "peek");
	via = sp.via;
	CHECK(shutdown(s, SHUT_WR) == 0, "shutdown");
	CHECK(smclo_recv_consume(s, 4) == 0, "the consume after shutdown(SHUT_WR)");
	CHECK(read(s, b, sizeof(b)) == 4 && !strcmp(b, "REQ2"), "read '%s' after consuming 4", b);
}

static pthread_key_t late_key;
static int late_fd;

static void late_send(void *arg)
{
	struct smclo_span sp;

	(void)arg;
	if (smclo_send_claim(late_fd, 5, &sp, 0) >= 5) {
		memcpy(sp.iov[0].iov_base, "LATE!", 5);
		smclo_send_commit(late_fd, 5, 0);
	}
}

static void *thread_with_late_destructor(void *arg)
{
	struct smclo_span sp;

	(void)arg;
	/* the API's table is made first; this key's destructor runs after its own */
	CHECK(smclo_send_claim(late_fd, 1, &sp, 0) > 0 && smclo_send_abort(late_fd) == 0, "claim");
	pthread_setspecific(late_key, (void *)1);
	return NULL;
}

static void check_destructor(void)
{
	char b[8] = { 0 };
	pthread_t t;
	int s;

	pair(&late_fd, &s);
	via = smclo_via(s);
	pthread_key_create(&late_key, late_send);
	pthread_create(&t, NULL, thread_with_late_destructor, NULL);
	pthread_join(t, NULL);
	CHECK(read(s, b, 5) == 5 && !strcmp(b, "LATE!"), "the destructor's bytes: '%s'", b);
}

static void *drain_late(void *arg)
{
	static char b[1 << 16];
	int fd = *(int *)arg;

	usleep(1000 * 1000);
	while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
		;
	return NULL;
}

static void check_claim_restart(void)
{
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
	struct itimerval it = { .it_value = { .tv_usec = 300000 } };
	struct smclo_span sp;
	pthread_t t;
	ssize_t n;
	int c, s;

	pair(&c, &s);
	via = smclo_via(c);
	if (via != SMCLO_VIA_RING)
		return;         /* a TCP claim hands out staging memory: no wait */
	while ((n = smclo_send_claim(c, 1, &sp, SMCLO_DONTWAIT)) > 0)
		CHECK(smclo_send_commit(c, (size_t)n, 0) == n, "fill");
	sigaction(SIGALRM, &sa, NULL);
	pthread_create(&t, NULL, drain_late, &s);
	setitimer(ITIMER_REAL, &it, NULL);
	n = smclo_send_claim(c, 1, &sp, 0);
	CHECK(n > 0, "a claim through a SA_RESTART signal gave %zd", n);
	smclo_send_abort(c);
	pthread_join(t, NULL);
}

static const struct {
	const char *name;
	void (*fn)(void);
} checks[] = {
	{ "fionread", check_fionread },
	{ "dontwait", check_dontwait },
	{ "close-slot", check_close_slot },
	{ "stale", check_stale },
	{ "rcvtimeo", check_rcvtimeo },
	{ "signal", check_signal },
	{ "shutwr", check_shutwr },
	{ "destructor", check_destructor },
	{ "claim-restart", check_claim_restart },
};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	for (size_t i = 0; argc == 2 && i < sizeof(checks) / sizeof(checks[0]); i++)
		if (!strcmp(argv[1], checks[i].name)) {
			checks[i].fn();
			printf("ok via=%s\n", via == SMCLO_VIA_RING ? "ring" : "copy");
			return 0;
		}
	fprintf(stderr, "usage: api_hazards CHECK (see the top of api_hazards.c)\n");
	return 2;
}
