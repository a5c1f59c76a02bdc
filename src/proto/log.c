/*
 * log.c - debug log.  Formats into a stack buffer and writes with one
 * write(2) so lines from several processes do not interleave, and so it is
 * safe inside our own socket wrappers (no stdio locks).
 */
#include "log.h"

#include "sys.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

pid_t sys_pid_cached;

void log_write(const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "smclo[%d]: ", (int)sys_getpid());
	va_list ap;

	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	/* raw syscall: write() may be interposed by ourselves */
	syscall(SYS_write, 2, buf, (size_t)n);
}
