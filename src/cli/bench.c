/*
 * bench.c - `smclo bench`: TCP loopback and smclo side by side.
 *
 * Two figures, as the kernel's own measurements took them
 * (docs/background.md): ping-pong latency of a small message and streaming
 * bandwidth of large writes; and connections set up per second (connect,
 * one round trip, close).  Every run starts a fresh server and
 * client process (this binary re-executed as a worker, with or without the
 * library preloaded); TCP and smclo runs are interleaved and the median of
 * the runs is reported with the CPU time both processes used; every other
 * round runs smclo first, so that neither side always inherits what the
 * other left behind (TIME_WAIT sockets, a warm or cold cache).  The smclo
 * runs use a private registry, and the table says whether their connections
 * were really accelerated.
 */
#include "cli.h"

#include "config.h"
#include "registry.h"
#include "stats.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STREAM_CHUNK (64 << 10)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	       ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int full_io(int fd, char *buf, size_t len, int writing)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = writing ? write(fd, buf + done, len - done) : read(fd, buf + done, len - done);
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			return -1;
		}
		done += (size_t)n;
	}
	return 0;
}

/* ---- the worker processes ----------------------------------------------- */

/*
 * Where the workers meet: a port on 127.0.0.1, or a path for an AF_UNIX
 * socket (make bench's reference column, bench/run.py).
 */
struct bench_addr {
	struct sockaddr_storage ss;
	socklen_t len;
};

static int bench_addr_parse(const char *where, struct bench_addr *a)
{
	memset(a, 0, sizeof(*a));
	if (where[0] == '/') {
		struct sockaddr_un *u = (struct sockaddr_un *)&a->ss;
		if (strlen(where) >= sizeof(u->sun_path))
			return -1;
		u->sun_family = AF_UNIX;
		strcpy(u->sun_path, where);
		a->len = sizeof(*u);
	} else {
		struct sockaddr_in *in = (struct sockaddr_in *)&a->ss;
		int port = atoi(where);
		if (port <= 0 || port > 65535)
			return -1;
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		a->len = sizeof(*in);
	}
	return 0;
}

static int bench_socket(const struct bench_addr *a)
{
	return socket(a->ss.ss_family, SOCK_STREAM, 0);
}

/* Small messages go out at once (AF_UNIX has no Nagle to turn off). */
static void no_delay(int fd, const struct bench_addr *a)
{
	int one = 1;

	if (a->ss.ss_family != AF_UNIX)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int worker_server(const struct bench_addr *a, const char *test, size_t size)
{
	int one = 1, l = bench_socket(a), c;
	char *buf = malloc(STREAM_CHUNK > size ? STREAM_CHUNK : size);
	double cpu0;

	if (a->ss.ss_family == AF_UNIX)
		unlink(((const struct sockaddr_un *)&a->ss)->sun_path);
	else
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (const void *)&a->ss, a->len) < 0 || listen(l, 4) < 0) {
		perror("bench server");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	if (!strcmp(test, "connect")) {
		/* one short request/response per connection; a connection that
		 * closes without a request is the client saying it is done */
		cpu0 = cpu_s();
		for (;;) {
			int ok;
			c = accept(l, NULL, NULL);
			if (c < 0) {
				if (errno == EINTR || errno == ECONNABORTED)
					continue;
				perror("bench accept");     /* EMFILE...: do not spin forever */
				return 1;
			}
			ok = full_io(c, buf, size, 0) == 0;
			if (ok)
				full_io(c, buf, size, 1);
			close(c);
			if (!ok)
				break;
		}
		fprintf(stdout, "cpu %.6f\n", cpu_s() - cpu0);
		return 0;
	}
	c = accept(l, NULL, NULL);
	no_delay(c, a);
	cpu0 = cpu_s();
	if (!strcmp(test, "pingpong")) {
		while (full_io(c, buf, size, 0) == 0 && full_io(c, buf, size, 1) == 0)
			;
	} else {
		unsigned long long total = 0;
		ssize_t n;
		while ((n = read(c, buf, STREAM_CHUNK)) > 0)
			total += (unsigned long long)n;
		char reply[64];
		int len = snprintf(reply, sizeof(reply), "%llu", total);
		full_io(c, reply, (size_t)len, 1);
	}
	fprintf(stdout, "cpu %.6f\n", cpu_s() - cpu0);
	return 0;
}

/* Connection setup: connect, one request/response of @size, close; per second. */
static int client_connect_rate(const struct bench_addr *a, size_t size, double seconds)
{
	char *buf = calloc(1, size);
	unsigned long conns = 0;
	double t0 = now_s(), t, cpu0 = cpu_s();

	do {
		int c = bench_socket(a);
		if (connect(c, (const void *)&a->ss, a->len) < 0 || full_io(c, buf, size, 1) ||
		    full_io(c, buf, size, 0)) {
			perror("bench connect");
			return 1;
		}
		close(c);
		conns++;
	} while ((t = now_s()) - t0 < seconds);
	printf("value %.1f\ncpu %.6f\n", conns / (t - t0), cpu_s() - cpu0);
	int done = bench_socket(a);     /* the end, for the server */
	if (connect(done, (const void *)&a->ss, a->len) == 0)
		close(done);
	return 0;
}

static int worker_client(const struct bench_addr *a, const char *test, size_t size,
                         double seconds)
{
	char *buf = calloc(1, STREAM_CHUNK > size ? STREAM_CHUNK : size);
	double t0, t, cpu0;
	int c;

	if (!strcmp(test, "connect"))
		return client_connect_rate(a, size, seconds);
	c = bench_socket(a);
	if (connect(c, (const void *)&a->ss, a->len) < 0) {
		perror("bench client");
		return 1;
	}
	no_delay(c, a);
	cpu0 = cpu_s();
	t0 = now_s();
	if (!strcmp(test, "pingpong")) {
		unsigned long rtts = 0;
		do {
			for (int i = 0; i < 100; i++)
				if (full_io(c, buf, size, 1) || full_io(c, buf, size, 0))
					return 1;
			rtts += 100;
		} while ((t = now_s()) - t0 < seconds);
		printf("value %.3f\n", (t - t0) / rtts * 1e6);      /* microseconds per round trip */
	} else {
		unsigned long long sent = 0;
		char reply[64] = { 0 };
		do {
			if (full_io(c, buf, STREAM_CHUNK, 1))
				return 1;
			sent += STREAM_CHUNK;
		} while (now_s() - t0 < seconds);
		shutdown(c, SHUT_WR);
		if (read(c, reply, sizeof(reply) - 1) <= 0 || strtoull(reply, NULL, 10) != sent) {
			fprintf(stderr, "bench: server received %s of %llu bytes\n", reply, sent);
			return 1;
		}
		t = now_s();
		printf("value %.3f\n", sent / (t - t0) / 1e6);      /* MB/s */
	}
	printf("cpu %.6f\n", cpu_s() - cpu0);
	return 0;
}

int cmd_bench_worker(int argc, char **argv)
{
	struct bench_addr a;

	if (argc != 6)
		return usage_error("__bench-worker: internal use only");
	if (bench_addr_parse(argv[2], &a) < 0)
		return usage_error("__bench-worker: a port or an absolute socket path");
	if (!strcmp(argv[1], "server"))
		return worker_server(&a, argv[3], strtoul(argv[4], NULL, 10));
	return worker_client(&a, argv[3], strtoul(argv[4], NULL, 10), atof(argv[5]));
}

/* ---- the orchestrator --------------------------------------------------- */

struct run_result {
	double value, cpu;
};

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int s = socket(AF_INET, SOCK_STREAM, 0), port;

	bind(s, (void *)&a, sizeof(a));
	getsockname(s, (void *)&a, &l);
	port = ntohs(a.sin_port);
	close(s);
	return port;
}

/* Start "smclo __bench-worker ARGS", preloaded when @smclo; returns its stdout. */
static FILE *spawn(const char *self, const char *lib, const char *regdir, int smclo,
                   char *const args[], pid_t *pid)
{
	int p[2];

	if (pipe(p) < 0)
		return NULL;
	*pid = fork();
	if (*pid == 0) {
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		if (smclo) {
			setenv("LD_PRELOAD", lib, 1);
			setenv("SMCLO_DIR", regdir, 1);
			unsetenv("SMCLO_DISABLE");
		} else {
			unsetenv("LD_PRELOAD");
		}
		execv(self, args);
		_exit(127);
	}
	close(p[1]);
	return fdopen(p[0], "r");
}

static int read_field(FILE *f, const char *key, double *out)
{
	char line[128];

	while (fgets(line, sizeof(line), f)) {
		size_t k = strlen(key);
		if (!strncmp(line, key, k) && line[k] == ' ') {
			*out = atof(line + k + 1);
			return 0;
		}
	}
	return -1;
}

static int one_run(const char *self, const char *lib, const char *regdir, int smclo,
                   const char *test, size_t size, double seconds, struct run_result *r)
{
	char port[16], sz[32], secs[32];
	pid_t sp, cp;
	FILE *so, *co;
	double scpu = 0;
	int st1 = 0, st2 = 0;

	snprintf(port, sizeof(port), "%d", free_port());
	snprintf(sz, sizeof(sz), "%zu", size);
	snprintf(secs, sizeof(secs), "%.3f", seconds);
	char *sargs[] = { (char *)self, "__bench-worker", "server", port, (char *)test, sz, secs, NULL };
	char *cargs[] = { (char *)self, "__bench-worker", "client", port, (char *)test, sz, secs, NULL };
	so = spawn(self, lib, regdir, smclo, sargs, &sp);
	char line[64];
	if (!so || !fgets(line, sizeof(line), so) || strncmp(line, "ready", 5)) {
		fprintf(stderr, "smclo bench: the server worker did not start\n");
		return -1;
	}
	co = spawn(self, lib, regdir, smclo, cargs, &cp);
	if (!co || read_field(co, "value", &r->value) < 0 || read_field(co, "cpu", &r->cpu) < 0) {
		fprintf(stderr, "smclo bench: the client worker failed\n");
		kill(sp, SIGKILL);
		return -1;
	}
	fclose(co);
	waitpid(cp, &st2, 0);
	if (read_field(so, "cpu", &scpu) < 0) {
		kill(sp, SIGKILL);
		scpu = 0;
	}
	fclose(so);
	waitpid(sp, &st1, 0);
	r->cpu += scpu;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void remove_registry(const char *regdir)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", regdir);
	if (system(cmd) != 0)
		fprintf(stderr, "smclo bench: could not remove %s\n", regdir);
}

/* What the smclo runs of one benchmark did with their connections. */
struct bench_counts {
	unsigned long long accelerated, short_lived, other;
};

static struct bench_counts counts_of(const struct stats_totals *tot)
{
	return (struct bench_counts){ .accelerated = tot->accelerated[ROLE_CLIENT],
	                              .short_lived = tot->fallback[R_SHORT_LIVED],
	                              .other = stats_fallback_not_short_lived(tot) };
}

/*
 * "N accelerated" plus those left on TCP; 0 if the figure is not an smclo
 * figure: a connection stayed on TCP for any reason but being short-lived
 * while the CPUs were busy (payoff.h), or a run accelerated nothing.
 */
static int counts_describe(const struct bench_counts *b, const struct bench_counts *a, int runs,
                           char *out, size_t len)
{
	unsigned long long acc = a->accelerated - b->accelerated;
	unsigned long long shortl = a->short_lived - b->short_lived, other = a->other - b->other;
	int n = snprintf(out, len, "%llu accelerated", acc);

	if (shortl && n > 0 && (size_t)n < len)
		n += snprintf(out + n, len - (size_t)n, ", %llu short-lived on tcp", shortl);
	if (other && n > 0 && (size_t)n < len)
		snprintf(out + n, len - (size_t)n, ", %llu on tcp for other reasons", other);
	return other == 0 && acc >= (unsigned long long)runs;
}

/*
 * What runs now and about how long is left, one line per step (a run of
 * one side of one benchmark).  The estimate starts from the planned length
 * of a step and then follows the average of the steps done.  On a terminal
 * the line is rewritten in place and cleared before a row of the table;
 * elsewhere (a log, a pipe) each step gets a line of its own, no escapes.
 */
struct progress {
	int step, steps, tty;
	double t0, planned;         /* seconds a step should take, before any has run */
};

static void progress_start(struct progress *p, int steps, double planned)
{
	*p = (struct progress){ .steps = steps, .tty = isatty(STDOUT_FILENO), .t0 = now_s(),
	                        .planned = planned };
}

static void progress_step(struct progress *p, const char *what)
{
	double each = p->step ? (now_s() - p->t0) / p->step : p->planned;
	long left = (long)(each * (p->steps - p->step) + 0.5);

	char eta[32];

	if (left < 60)
		snprintf(eta, sizeof(eta), "%ld s", left);
	else
		snprintf(eta, sizeof(eta), "%ld min %02ld s", left / 60, left % 60);
	p->step++;
	printf("%s[%d/%d] %s; about %s left%s", p->tty ? "\r\033[K" : "", p->step, p->steps,
	       what, eta, p->tty ? "" : "\n");
	fflush(stdout);
}

/* Before a line of the results: take the step's line off a terminal. */
static void progress_clear(const struct progress *p)
{
	if (p->tty)
		printf("\r\033[K");
}

/* What one `smclo bench` is asked to do. */
struct bench_args {
	double seconds;
	int runs;
	size_t msg;
};

static int bench_parse(int argc, char **argv, struct bench_args *a)
{
	*a = (struct bench_args){ .seconds = 1.0, .runs = 5, .msg = 14 };
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			a->seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			a->runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			a->msg = strtoul(argv[++i], NULL, 10);
		else
			return usage_error("bench: unknown option '%s' (use --seconds S, --runs N, "
			                   "--size BYTES)", argv[i]);
	}
	if (a->seconds <= 0 || a->seconds > 60 || a->runs < 1 || a->runs > 50 || a->msg < 1 ||
	    a->msg > (1 << 20))
		return usage_error("bench: --seconds 0..60, --runs 1..50, --size 1..1048576");
	return 0;
}

static const struct bench_test { const char *test, *label, *unit; } bench_tests[] = {
	{ "pingpong", "ping-pong latency", "us" },
	{ "stream", "stream bandwidth (64 KiB writes)", "MB/s" },
	{ "connect", "connection setup (RTT, close)", "/s" },
};

/* Where a run finds the programs and the registry. */
struct bench_env {
	const char *self, *lib, *regdir;
	struct stats_totals *tot;
	struct progress pr;
};

/*
 * One benchmark's runs, TCP and smclo interleaved, and its row: -1 when a
 * run failed, else whether every smclo connection was accelerated.
 */
static int bench_row(struct bench_env *env, const struct bench_args *a, const struct bench_test *t)
{
	double val[2][50], cpu[2][50];
	struct bench_counts before = counts_of(env->tot), after;
	char cpus[64], conns[96];
	int all;

	for (int r = 0; r < a->runs; r++)
		for (int i = 0; i < 2; i++) {
			int mode = i ^ (r & 1);
			struct run_result res;
			char what[128];

			snprintf(what, sizeof(what), "%s, %s, run %d of %d", t->label,
			         mode ? "smclo" : "tcp loopback", r + 1, a->runs);
			progress_step(&env->pr, what);
			if (one_run(env->self, env->lib, env->regdir, mode, t->test, a->msg, a->seconds,
			            &res) < 0)
				return -1;
			val[mode][r] = res.value;
			cpu[mode][r] = res.cpu;
		}
	double tcp = median(val[0], a->runs), shm = median(val[1], a->runs);
	after = counts_of(env->tot);
	all = counts_describe(&before, &after, a->runs, conns, sizeof(conns));
	snprintf(cpus, sizeof(cpus), "%.2f -> %.2f", median(cpu[0], a->runs), median(cpu[1], a->runs));
	progress_clear(&env->pr);
	printf("%-34s %10.2f %-4s %10.2f %-4s %7.2fx   %-26s %s\n", t->label, tcp,
	       t->unit, shm, t->unit, shm / tcp, cpus, conns);
	return all;
}

int cmd_bench(int argc, char **argv)
{
	const int ntests = (int)(sizeof(bench_tests) / sizeof(bench_tests[0]));
	struct bench_args a;
	struct bench_env env;
	char self[4096], lib[4096], regdir[64], err[300];
	int all = 1, rc;

	if ((rc = bench_parse(argc, argv, &a)) != 0)
		return rc;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return usage_error("bench: cannot find my own location");
	self[n] = '\0';
	if (find_library(lib, sizeof(lib)) < 0)
		return usage_error("bench: libsmclo.so is missing: %s (run make)", lib);
	/* where the default registry lives: in memory, not on disk */
	snprintf(regdir, sizeof(regdir), "%s/smclo-bench-XXXXXX",
	         access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(regdir))
		return usage_error("bench: cannot create a registry directory: %m");
	/* the smclo runs' registry, mapped here to tell whether they were accelerated */
	int dfd = registry_open(regdir, 0, err, sizeof(err));
	env = (struct bench_env){ .self = self, .lib = lib, .regdir = regdir,
	                          .tot = dfd >= 0 ? stats_totals_map(dfd) : NULL };
	if (!env.tot) {
		remove_registry(regdir);
		return usage_error("bench: registry %s: %s", regdir, dfd < 0 ? err : "no stats file");
	}
	printf("smclo bench: %d interleaved runs of %.1f s each, median; message %zu B\n\n",
	       a.runs, a.seconds, a.msg);
	printf("%-34s %14s %14s %8s   %-26s %s\n", "benchmark", "tcp loopback", "smclo", "ratio",
	       "cpu s/run (tcp -> smclo)", "smclo connections");
	/* a step is its seconds plus starting two processes and, for connect, the end */
	progress_start(&env.pr, ntests * a.runs * 2, a.seconds + 0.2);
	for (int t = 0; t < ntests; t++) {
		int r = bench_row(&env, &a, &bench_tests[t]);

		if (r < 0)
			return 1;
		all &= r;
	}
	if (!all)
		printf("\n<-- NOT all accelerated: a connection stayed on TCP for a reason other "
		       "than being short-lived on busy CPUs\n");
	printf("ratio: latency below 1 and bandwidth above 1 mean smclo is faster\n");
	remove_registry(regdir);
	return all ? 0 : 1;
}
