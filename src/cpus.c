/*
 * cpus.c - CPUs online, allowed, granted by the cgroup, and wanted (cpus.h).
 *
 * Pinned to one CPU, a waiter that spins only keeps its peer from running
 * there (measured: a third of the CPU went to spinning, ping-pong 3.95x
 * slower than TCP); under a quota of one CPU, or beside more runnable tasks
 * than CPUs, each connection's CPU time is what limits the rate.  These are
 * the facts smclo looks at for both, kept cheap: each is a cached sample.
 */
#include "cpus.h"

#include "sys.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SAMPLE_NS       50000000LL      /* affinity and load */
#define QUOTA_SAMPLE_NS 1000000000LL

/* A small file (/proc, cgroupfs) as a string; its length, or -1. */
static ssize_t read_text(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = sys_read(fd, buf, size - 1);
	sys_close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return n;
}

int cpus_online(void)
{
	static int ncpu;

	if (!ncpu)
		ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	return ncpu;
}

/* Whether a sample taken at *@at is older than @period; if so, the caller
 * takes the next one (a race between threads costs a second look). */
static int sample_stale(_Atomic long long *at, long long now, long long period)
{
	if (now - atomic_load_explicit(at, memory_order_relaxed) < period &&
	    atomic_load_explicit(at, memory_order_relaxed))
		return 0;
	atomic_store_explicit(at, now, memory_order_relaxed);
	return 1;
}

int cpus_allowed(long long now)
{
	static _Atomic long long at;
	static _Atomic int allowed;
	cpu_set_t set;

	if (sample_stale(&at, now, SAMPLE_NS) || !atomic_load(&allowed))
		atomic_store(&allowed, sched_getaffinity(0, sizeof(set), &set) == 0 ?
		             CPU_COUNT(&set) : cpus_online());
	return atomic_load(&allowed);
}

int cpus_surplus(long long now)
{
	static _Atomic long long at;
	static _Atomic int surplus;
	char buf[128], *slash;

	if (!sample_stale(&at, now, SAMPLE_NS))
		return atomic_load_explicit(&surplus, memory_order_relaxed);
	if (read_text("/proc/loadavg", buf, sizeof(buf)) <= 0)
		return 0;
	/* "0.08 0.03 0.01 2/75 9985": the number before the slash */
	slash = strchr(buf, '/');
	while (slash && slash > buf && slash[-1] != ' ')
		slash--;
	atomic_store(&surplus, slash ? atoi(slash) - cpus_online() : 0);
	return atomic_load(&surplus);
}

/* ---- the cgroup's quota --------------------------------------------------- */

/*
 * Where the quota is, found once: the cgroup named in /proc/self/cgroup
 * under the usual mount points (v1's cpu controller, else v2's cpu.max).
 * A container that sees its host's cgroup path but mounts only its own
 * cgroup (no cgroup namespace) finds its files at the mount's top.  Only the
 * process's own cgroup is read, not its ancestors'.
 */
static char quota_file[PATH_MAX], period_file[PATH_MAX];
static pthread_once_t quota_once = PTHREAD_ONCE_INIT;

static int has_token(const char *list, const char *tok)
{
	size_t n = strlen(tok);

	for (const char *p = list; p; p = strchr(p, ',')) {
		if (*p == ',')
			p++;
		if (strncmp(p, tok, n) == 0 && (p[n] == ',' || p[n] == '\0'))
			return 1;
	}
	return 0;
}

/* @a followed by @b in @buf; 0, or -1 if it does not fit (never used cut). */
static int path_join(char *buf, size_t size, const char *a, const char *b)
{
	int n = snprintf(buf, size, "%s%s", a, b);

	return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* Point the quota files at @dir if it has them (names start with '/'). */
static int quota_files_at(const char *dir, const char *quota, const char *period)
{
	if (path_join(quota_file, sizeof(quota_file), dir, quota) < 0 ||
	    access(quota_file, R_OK) != 0 ||
	    (period && path_join(period_file, sizeof(period_file), dir, period) < 0)) {
		quota_file[0] = period_file[0] = '\0';
		return 0;
	}
	return 1;
}

static int quota_files_under(const char *const *mounts, const char *path,
                             const char *quota, const char *period)
{
	char dir[PATH_MAX];

	for (int i = 0; mounts[i]; i++) {
		if ((path_join(dir, sizeof(dir), mounts[i], path) == 0 &&
		     quota_files_at(dir, quota, period)) ||
		    quota_files_at(mounts[i], quota, period))
			return 1;
	}
	return 0;
}

static void quota_find(void)
{
	static const char *const v1_mounts[] = {
		"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct", NULL };
	static const char *const v2_mounts[] = { "/sys/fs/cgroup", "/sys/fs/cgroup/unified", NULL };
	char buf[4096], *line, *save, *v1 = NULL, *v2 = NULL;

	if (read_text("/proc/self/cgroup", buf, sizeof(buf)) <= 0)
		return;
	/* "4:cpu,cpuacct:/docker/ab12" (v1), "0::/user.slice/x.scope" (v2) */
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;

		if (!path)
			continue;
		*path++ = '\0';
		if (!ctl[1])
			v2 = path;
		else if (has_token(ctl + 1, "cpu"))
			v1 = path;
	}
	if (v1 && quota_files_under(v1_mounts, strcmp(v1, "/") ? v1 : "",
	                            "/cpu.cfs_quota_us", "/cpu.cfs_period_us"))
		return;
	if (v2)
		quota_files_under(v2_mounts, strcmp(v2, "/") ? v2 : "", "/cpu.max", NULL);
}

/* The quota in whole CPUs from the files found, 0 for none. */
static int quota_read(void)
{
	char q[64], p[64];
	long long quota, period;

	if (!quota_file[0] || read_text(quota_file, q, sizeof(q)) <= 0)
		return 0;
	if (period_file[0]) {           /* v1: two numbers, quota -1 for none */
		if (read_text(period_file, p, sizeof(p)) <= 0)
			return 0;
		quota = atoll(q);
		period = atoll(p);
	} else if (sscanf(q, "%lld %lld", &quota, &period) != 2) {
		return 0;               /* v2: "max 100000" for none */
	}
	if (quota <= 0 || period <= 0)
		return 0;
	return (int)((quota + period - 1) / period);
}

int cpus_quota(long long now)
{
	static _Atomic long long at;
	static _Atomic int quota;

	pthread_once(&quota_once, quota_find);
	if (sample_stale(&at, now, QUOTA_SAMPLE_NS))
		atomic_store(&quota, quota_read());
	return atomic_load(&quota);
}

/*
 * Short-lived connections leave acceleration on a surer sign than spinning
 * does: an idle machine running a client and a server that both spin counts
 * up to ncpu + 2 now and then (measured during make bench), a machine
 * beside busy loops more.  One CPU allowed, or a quota under two, is busy
 * whatever the load: client and server then take turns on one CPU's worth
 * of time, so CPU time is what a connection costs there too.
 */
int cpus_busy(void)
{
	long long now = mono_now_ns();
	int quota = cpus_quota(now);

	return cpus_allowed(now) < 2 || (quota && quota < 2) || cpus_surplus(now) > 2;
}
