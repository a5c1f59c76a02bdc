/*
 * stdio_upper - an inetd-style service written with stdio: reads lines
 * from stdin with fgets(), writes them upper-cased to stdout with fputs().
 * glibc's stdio reaches the kernel through internal entries no preload
 * library sees (tests/py/test_exec.py::test_stdio_service).
 */
#include <ctype.h>
#include <stdio.h>

int main(void)
{
	char line[4096];

	while (fgets(line, sizeof(line), stdin)) {
		for (char *p = line; *p; p++)
			*p = (char)toupper((unsigned char)*p);
		fputs(line, stdout);
		fflush(stdout);
	}
	return 0;
}
