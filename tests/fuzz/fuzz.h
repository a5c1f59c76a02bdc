/*
 * fuzz.h - helpers shared by the libFuzzer harnesses in tests/fuzz/.
 *
 * An input is read front to back through a struct in: every take_* returns
 * zero bytes once the input is used up, so a harness never reads past it
 * and a short input is simply a short scenario.  FUZZ_CHECK aborts with the
 * failed condition: libFuzzer reports the abort as a crash and keeps the
 * input, like any sanitizer report.
 */
#ifndef SMCLO_FUZZ_H
#define SMCLO_FUZZ_H

#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_CHECK(cond) do { \
	if (!(cond)) { \
		fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
		abort(); \
	} \
} while (0)

/*
 * For a harness's own loops over every byte (filling a buffer, checking a
 * copy): without coverage instrumentation, they cost what they would
 * uninstrumented instead of a traced comparison per byte, which made the
 * data-path harness spend most of its time in its checks.  Nothing in src/
 * is marked.
 */
#define FUZZ_QUIET __attribute__((no_sanitize("coverage"), noinline))

struct in {
	const uint8_t *p;
	size_t n;
};

static inline size_t take(struct in *in, void *out, size_t len)
{
	size_t k = len < in->n ? len : in->n;

	memset(out, 0, len);
	memcpy(out, in->p, k);
	in->p += k;
	in->n -= k;
	return k;
}

static inline uint8_t take_u8(struct in *in)
{
	uint8_t v;
	take(in, &v, sizeof(v));
	return v;
}

static inline uint16_t take_u16(struct in *in)
{
	uint16_t v;
	take(in, &v, sizeof(v));
	return v;
}

static inline uint32_t take_u32(struct in *in)
{
	uint32_t v;
	take(in, &v, sizeof(v));
	return v;
}

static inline uint64_t take_u64(struct in *in)
{
	uint64_t v;
	take(in, &v, sizeof(v));
	return v;
}

/*
 * SMCLO_FUZZ_SKIP_KNOWN=1: a harness steers clear of the inputs that
 * trigger a src/ bug it already found (each harness names its own at the
 * top), so a run can look for others before that one is fixed.  Off by
 * default: the bug is reported until it is fixed.
 */
static inline int fuzz_skip_known(void)
{
	static int v = -1;

	if (v < 0) {
		const char *e = getenv("SMCLO_FUZZ_SKIP_KNOWN");
		v = e && *e && strcmp(e, "0") != 0;
	}
	return v;
}

/* Remove @path and everything under it. */
static inline void fuzz_rm_tree(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		char sub[4096];
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
		if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
			fuzz_rm_tree(sub);
		else
			unlink(sub);
	}
	closedir(d);
	rmdir(path);
}

/*
 * A fresh private directory for a harness's registry, under $FUZZ_TMPDIR
 * (run.sh makes one per run and removes it), else on tmpfs when there is
 * one (the harnesses create and remove files on every input), else in
 * $TMPDIR or /tmp.  Removed at exit (not after a crash: run.sh's goes).
 */
static char fuzz_dir_path[512];

static inline void fuzz_dir_cleanup(void)
{
	if (fuzz_dir_path[0])
		fuzz_rm_tree(fuzz_dir_path);
}

static inline const char *fuzz_tmpdir(const char *tag)
{
	const char *bases[] = { getenv("FUZZ_TMPDIR"), "/dev/shm", getenv("TMPDIR"), "/tmp" };

	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		if (!bases[i] || access(bases[i], W_OK) != 0)
			continue;
		snprintf(fuzz_dir_path, sizeof(fuzz_dir_path), "%s/smclo-fuzz-%s-XXXXXX",
		         bases[i], tag);
		if (mkdtemp(fuzz_dir_path)) {
			atexit(fuzz_dir_cleanup);
			return fuzz_dir_path;
		}
	}
	fprintf(stderr, "fuzz: no temporary directory\n");
	abort();
}

#endif
