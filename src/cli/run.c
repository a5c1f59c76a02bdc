/*
 * run.c - `smclo run -- PROGRAM`: start a program with the library preloaded.
 *
 * Options become SMCLO_* variables; they are validated here with the
 * library's own parser so a typo fails now, with a message, rather than
 * silently inside the program.  The library is found relative to this
 * executable: where `make install` and the Debian package put it, else
 * beside the command in the build tree.  The program is looked at first
 * (inspect.c) and a program smclo cannot reach is named on stderr.
 */
#include "cli.h"

#include "config.h"
#include "version.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char run_usage[] =
	"usage: smclo run [options] -- PROGRAM [ARGS...]\n"
	"  -r, --rmem SIZE   largest ring accepted from a peer (16k..16m, power of two)\n"
	"  -t, --wmem SIZE   ring this program sends through (16k..16m, power of two)\n"
	"  -d, --dir DIR     registry directory (default: private per user)\n"
	"  -v, --debug       name the library used, log every decision to stderr\n";

/*
 * Where is libsmclo.so?  First where an installation puts it relative to
 * the command (bindir/../lib/<multiarch>), so an installed smclo never
 * picks up a build tree; then beside the command, as in the build tree.
 * 0 and the path in @out (resolved: it goes into LD_PRELOAD and into
 * /proc/PID/maps as is), or -1 and both places tried in @out.
 */
int find_library(char *out, size_t len)
{
	char dir[PATH_MAX], installed[PATH_MAX + 64], beside[PATH_MAX + 16];

	if (self_dir(dir, sizeof(dir)) < 0) {
		snprintf(out, len, "(cannot read /proc/self/exe: %s)", strerror(errno));
		return -1;
	}
	if (SMCLO_LIBDIR_FROM_BINDIR[0] == '/')
		snprintf(installed, sizeof(installed), "%s/libsmclo.so", SMCLO_LIBDIR_FROM_BINDIR);
	else
		snprintf(installed, sizeof(installed), "%s/%s/libsmclo.so", dir,
		         SMCLO_LIBDIR_FROM_BINDIR);
	snprintf(beside, sizeof(beside), "%s/libsmclo.so", dir);
	if (access(installed, R_OK) == 0 && realpath(installed, dir) && strlen(dir) < len) {
		strcpy(out, dir);
		return 0;
	}
	if (access(beside, R_OK) == 0 && realpath(beside, dir) && strlen(dir) < len) {
		strcpy(out, dir);
		return 0;
	}
	snprintf(out, len, "neither %s nor %s", installed, beside);
	return -1;
}

/* LD_PRELOAD for the program: SMCLO_PRELOAD_FIRST, the library, then what
 * the caller preloads already.  NULL if out of memory. */
static char *preload_value(const char *lib)
{
	const char *old = getenv("LD_PRELOAD"), *first = getenv("SMCLO_PRELOAD_FIRST");
	char *preload;

	/* the library ahead of what the program would preload anyway; only
	 * SMCLO_PRELOAD_FIRST (a sanitizer's runtime, which must be the very
	 * first object loaded) goes ahead of it */
	if (!old)
		old = "";
	if (!first)
		first = "";
	preload = malloc(strlen(first) + strlen(lib) + strlen(old) + 3);
	if (preload)
		sprintf(preload, "%s%s%s%s%s", first, *first ? ":" : "", lib, *old ? ":" : "", old);
	return preload;
}

/* The program could not be started: say why, naming it. */
static int exec_failed(const char *prog, int err)
{
	if (err == ENOENT && !strchr(prog, '/'))
		usage_error("run: %s: command not found (PATH=%s)", prog,
		            getenv("PATH") ? getenv("PATH") : "unset");
	else
		usage_error("run: cannot start %s: %s", prog, strerror(err));
	return 127;
}

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
	char lib[PATH_MAX + 128], err[300], *preload;
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
	if (find_library(lib, sizeof(lib)) < 0)
		return usage_error("run: libsmclo.so is missing: %s (build it with make, or "
		                   "install smclo again)", lib);
	if (c.debug)
		fprintf(stderr, "smclo: smclo %s preloads %s\n", SMCLO_VERSION, lib);
	if (!c.disabled)
		inspect_program(argv[optind], argv + optind);
	if (!(preload = preload_value(lib)))
		return usage_error("run: out of memory");
	setenv("LD_PRELOAD", preload, 1);
	execvp(argv[optind], argv + optind);
	return exec_failed(argv[optind], errno);
}
