/*
 * cli.h - subcommands of the `smclo` command.
 */
#ifndef SMCLO_CLI_H
#define SMCLO_CLI_H

#include <stddef.h>

int cmd_run(int argc, char **argv);
int cmd_stat(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_worker(int argc, char **argv);

/* Print "smclo: <message>" to stderr and return 2 (usage error). */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Directory holding the smclo binary (to find libsmclo.so beside it). */
int self_dir(char *out, size_t len);

/* The library `smclo run` preloads: installed place first, then the build
 * tree (run.c).  0 and its path, or -1 and the places tried, in @out. */
int find_library(char *out, size_t len);

/* Find a program as execvp() would (inspect.c). */
int resolve_program(const char *file, char *out, size_t len);

/* Warn on stderr if the preload library cannot work in the program
 * @file run with @argv: static, Go, set-ID, LD_PRELOAD dropped (inspect.c). */
void inspect_program(const char *file, char *const argv[]);

struct smclo_config;
struct stats_totals;
/*
 * stat.c: open the registry the environment names (SMCLO_DIR), map this
 * user's totals and tidy it (cli_registry_tidy); a usage error (2) if it
 * cannot be used.
 */
int cli_registry_open(struct smclo_config *c, int *dirfd, struct stats_totals **tot);
/* Fold tables of dead processes into @tot and remove entries nobody holds. */
void cli_registry_tidy(int dirfd, struct stats_totals *tot);
/* Print @s to stdout as a JSON string, quoted and escaped. */
void json_string(const char *s);

#endif
