/*
 * canary.c - proof that tools/sanitize.sh collects reports: preloaded into
 * `smclo run -- true`, it makes one planted error in the program "true"
 * (SANITIZE_CANARY=asan: a heap overflow, =ubsan: a signed overflow),
 * and sanitize.sh insists that the report reached its log directory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

__attribute__((constructor)) static void canary(void)
{
	const char *what = getenv("SANITIZE_CANARY");

	if (!what || strcmp(program_invocation_short_name, "true"))
		return;
	if (!strcmp(what, "asan")) {
		volatile char *p = malloc(16);
		p[16] = 1;                      /* heap-buffer-overflow */
		free((void *)p);
	} else {
		volatile int i = INT_MAX;
		i = i + 1;                      /* signed integer overflow */
	}
}
