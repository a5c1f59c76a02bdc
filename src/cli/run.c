/*
 * run.c - `smclo run -- PROGRAM`: start a program with the library preloaded.
 *
 * Options become SMCLO_* variables; they are validated here with the
 * library's own parser so a typo fails now, with a message, rather than
 * silently inside the program.
 */
#include "cli.h"

#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char run_usage[] =
	"usage: smclo run [options] -- PROGRAM [ARGS...]\n"
	"  -r, --rmem SIZE   largest ring accepted from a peer (16k..16m, power of two)\n"
	"  -t, --wmem SIZE   ring this program sends through (16k..16m, power of two)\n"
	"  -d, --dir DIR     registry directory (default: private per user)\n"
	"  -v, --debug       log every decision to stderr\n";

int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "rmem", required_argument, NULL, 'r' },
		{ "wmem", required_argument, NULL, 't' },
		{ "dir", required_argument, NULL, 'd' },
		{ "debug", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	char lib[4096], err[300], *preload;
	const char *old, *first;
	struct smclo_config c;
	int o;

	while ((o = getopt_long(argc, argv, "+r:t:d:vh", opts, NULL)) != -1) {
		switch (o) {
		case 'r': setenv("SMCLO_RMEM", optarg, 1); break;
		case 't': setenv("SMCLO_WMEM", optarg, 1); break;
		case 'd': setenv("SMCLO_DIR", optarg, 1); break;
		case 'v': setenv("SMCLO_DEBUG", "1", 1); break;
		case 'h': fputs(run_usage, stdout); return 0;
		default:  fputs(run_usage, stderr); return 2;
		}
	}
	if (optind >= argc) {
		fputs(run_usage, stderr);
		return usage_error("run: no program given");
	}
	if (config_load(&c, err, sizeof(err)) < 0)
		return usage_error("%s", err);
	if (self_dir(lib, sizeof(lib) - 32) < 0)
		return usage_error("run: cannot find my own location");
	strcat(lib, "/libsmclo.so");
	if (access(lib, R_OK) != 0)
		return usage_error("run: %s is missing (build it with make)", lib);
	/* the library ahead of what the program would preload anyway; only
	 * SMCLO_PRELOAD_FIRST (a sanitizer's runtime, which must be the very
	 * first object loaded) goes ahead of it */
	old = getenv("LD_PRELOAD");
	first = getenv("SMCLO_PRELOAD_FIRST");
	if (!old)
		old = "";
	if (!first)
		first = "";
	preload = malloc(strlen(first) + strlen(lib) + strlen(old) + 3);
	if (!preload)
		return usage_error("run: out of memory");
	sprintf(preload, "%s%s%s%s%s", first, *first ? ":" : "", lib, *old ? ":" : "", old);
	setenv("LD_PRELOAD", preload, 1);
	execvp(argv[optind], argv + optind);
	usage_error("run: %s: %m", argv[optind]);
	return 127;
}
