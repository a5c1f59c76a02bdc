/*
 * ubsan_log_path.c - send UBSan's reports to a file when ASan is loaded too.
 *
 * GCC's -fsanitize=address,undefined uses two runtimes, libasan and
 * libubsan, each with its own copy of the report writer.  libubsan sets its
 * log file through __sanitizer_set_report_path, but libasan exports that name
 * too and, loaded first, wins: UBSAN_OPTIONS=log_path lands in ASan's copy
 * and UBSan's reports stay on stderr, which the tests capture and discard.
 * Preloaded after both runtimes, this calls libubsan's own copy with the
 * path in SANITIZE_UBSAN_LOG_PATH.  (Preloaded objects are initialised last
 * first, so this one runs before the library's constructor.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

static int find_ubsan(struct dl_phdr_info *i, size_t size, void *out)
{
	if (strstr(i->dlpi_name, "/libubsan.so")) {
		*(const char **)out = i->dlpi_name;
		return 1;
	}
	return 0;
}

__attribute__((constructor)) static void ubsan_log_path(void)
{
	const char *path = getenv("SANITIZE_UBSAN_LOG_PATH"), *name = NULL;
	void (*set)(const char *);
	void *h;

	if (!path || !dl_iterate_phdr(find_ubsan, &name) ||
	    !(h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)))
		return;
	set = (void (*)(const char *))dlsym(h, "__sanitizer_set_report_path");
	if (set)
		set(path);
	dlclose(h);
}
