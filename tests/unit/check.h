/*
 * check.h - the smallest test harness: CHECK() counts, main() reports
 * "N passed, N failed" and exits non-zero on any failure.
 */
#ifndef SMCLO_CHECK_H
#define SMCLO_CHECK_H

#include <stdio.h>

static int checks_passed, checks_failed;

#define CHECK(cond) do {                                                    \
	if (cond) {                                                         \
		checks_passed++;                                            \
	} else {                                                            \
		checks_failed++;                                            \
		fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
	}                                                                   \
} while (0)

static int check_report(const char *name)
{
	printf("%s: %d passed, %d failed\n", name, checks_passed, checks_failed);
	return checks_failed ? 1 : 0;
}

#endif
