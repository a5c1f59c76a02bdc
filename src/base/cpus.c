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
	int fd = sys_open_read(path);
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
	static _Atomic int ncpu;        /* threads may race to fill it, alike */
	int n = atomic_load_explicit(&ncpu, memory_order_relaxed);

	if (!n) {
		n = (int)sysconf(_SC_NPROCESSORS_ONLN);
		atomic_store_explicit(&ncpu, n, memory_order_relaxed);
	}
	return n;
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
 * Where the quotas are, found once: the process's cgroup (named in
 * /proc/self/cgroup) under the usual mount points, v1's cpu controller
 * first, else v2.  The quota that binds is the smallest on the way up to the
 * mount's top: a container's limit may sit on its own cgroup or on one above
 * it (a pod, a systemd slice).  A container that sees its host's cgroup path
 * but mounts only its own cgroup (no cgroup namespace) has it at the top.
 */
static char cgroup_dir[PATH_MAX];       /* the process's cgroup; "" if none found */
static size_t cgroup_top_len;           /* the mount's top: a prefix of cgroup_dir */
static int cgroup_v1;                   /* cpu.cfs_quota_us, not cpu.max */
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

/* Take @path under the first of @mounts that is a cgroup mount of the kind
 * @marker (a file only such a mount's top has) names. */
static int cgroup_dir_under(const char *const *mounts, const char *marker, const char *path)
{
	char probe[PATH_MAX];

	for (int i = 0; mounts[i]; i++) {
		if (path_join(probe, sizeof(probe), mounts[i], marker) < 0 || access(probe, F_OK))
			continue;
		if (path_join(cgroup_dir, sizeof(cgroup_dir), mounts[i], path) < 0 ||
		    access(cgroup_dir, F_OK))
			snprintf(cgroup_dir, sizeof(cgroup_dir), "%s", mounts[i]);
		cgroup_top_len = strlen(mounts[i]);
		return 1;
	}
	cgroup_dir[0] = '\0';
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
	if (v1 && cgroup_dir_under(v1_mounts, "/cpu.cfs_period_us", strcmp(v1, "/") ? v1 : "")) {
		cgroup_v1 = 1;
		return;
	}
	if (v2)
		cgroup_dir_under(v2_mounts, "/cgroup.controllers", strcmp(v2, "/") ? v2 : "");
}

/* The quota of the cgroup at @dir in whole CPUs, rounded up; 0 for none. */
static int quota_at(const char *dir)
{
	char path[PATH_MAX], q[64], p[64];
	long long quota, period;

	if (cgroup_v1) {                /* two numbers, quota -1 for none */
		if (path_join(path, sizeof(path), dir, "/cpu.cfs_quota_us") < 0 ||
		    read_text(path, q, sizeof(q)) <= 0 ||
		    path_join(path, sizeof(path), dir, "/cpu.cfs_period_us") < 0 ||
		    read_text(path, p, sizeof(p)) <= 0)
			return 0;
		quota = atoll(q);
		period = atoll(p);
	} else if (path_join(path, sizeof(path), dir, "/cpu.max") < 0 ||
	           read_text(path, q, sizeof(q)) <= 0 ||
	           sscanf(q, "%lld %lld", &quota, &period) != 2) {
		return 0;               /* "max 100000" for none */
	}
	if (quota <= 0 || period <= 0)
		return 0;
	return (int)((quota + period - 1) / period);
}

/* The smallest quota from the process's cgroup up to the mount's top. */
static int quota_read(void)
{
	char dir[PATH_MAX];
	size_t len = strlen(cgroup_dir);
	int least = 0;

	if (!len)
		return 0;
	memcpy(dir, cgroup_dir, len + 1);
	for (;;) {
		int q = quota_at(dir);

		if (q && (!least || q < least))
			least = q;
		if (len <= cgroup_top_len)
			return least;
		while (len > cgroup_top_len && dir[len - 1] != '/')
			len--;          /* the parent: drop the last name */
		if (len > cgroup_top_len)
			len--;          /* and its slash */
		dir[len] = '\0';
	}
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
