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

#endif
