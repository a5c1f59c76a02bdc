/* placeholder replaced below */
#include "cli.h"
int cmd_bench(int argc, char **argv) { (void)argc; (void)argv; return 1; }
int cmd_bench_worker(int argc, char **argv) { (void)argc; (void)argv; return 1; }
