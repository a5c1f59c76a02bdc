/*
 * main.c - `smclo`: dispatch to the subcommands.
 */
#include "cli.h"

#include "version.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
	"usage: smclo --version\n"
	"       smclo run [-r SIZE] [-t SIZE] [-d DIR] [-v] -- PROGRAM [ARGS...]\n"
	"       smclo stat [--json] [--pid PID] [--port PORT] [--listening] [--tcp] [--shm]\n"
	"                  [--watch [SECONDS] [--count N]]   live connections, listeners\n"
	"       smclo stats [--json | --prometheus] [--reset]   totals since the registry was created\n"
	"       smclo bench [--seconds N] [--size BYTES]   TCP loopback vs smclo\n"
	"\n"
	"environment: SMCLO_DIR, SMCLO_RMEM, SMCLO_WMEM, SMCLO_HANDSHAKE_MS,\n"
	"             SMCLO_MAX_CONNS, SMCLO_ALLOW_UIDS, SMCLO_CROSS_NETNS,\n"
	"             SMCLO_DEBUG=1, SMCLO_DISABLE=1   (see man/smclo.1)\n";

int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("smclo: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

int self_dir(char *out, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", out, len - 1);
	char *slash;

	if (n <= 0)
		return -1;
	out[n] = '\0';
	slash = strrchr(out, '/');
	if (!slash)
		return -1;
	*slash = '\0';
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("smclo %s\n", SMCLO_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stat"))
		return cmd_stat(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stats"))
		return cmd_stats(argc - 1, argv + 1);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 1, argv + 1);
	if (!strcmp(argv[1], "__bench-worker"))
		return cmd_bench_worker(argc - 1, argv + 1);
	fputs(usage, stderr);
	return usage_error("unknown command '%s'", argv[1]);
}
