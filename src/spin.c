/*
 * spin.c - bounded busy-wait before a blocking sleep (see spin.h).
 */
#include "spin.h"

#include "deferred.h"
#include "sys.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

long long spin_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/*
 * Runnable tasks beyond the CPUs, from the kernel's count of running tasks
 * (/proc/loadavg, 4th field, "running/total"), read at most every 50 ms.
 * The count includes the caller, and a sampled instant often catches one
 * passing task.
 */
static int tasks_over_cpus(long long now, int ncpu)
{
	static _Atomic long long checked_at;
	static _Atomic int surplus;
	char buf[128], *slash;
	ssize_t n;
	int fd;

	if (now - atomic_load_explicit(&checked_at, memory_order_relaxed) < 50000000LL)
		return atomic_load_explicit(&surplus, memory_order_relaxed);
	atomic_store(&checked_at, now);
	fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = sys_read(fd, buf, sizeof(buf) - 1);
	sys_close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	slash = strchr(buf, '/');
	while (slash && slash > buf && slash[-1] != ' ')
		slash--;
	atomic_store(&surplus, slash ? atoi(slash) - ncpu : 0);
	return atomic_load(&surplus);
}

/* A spinning waiter only steals time from the peer it waits for: only a
 * clear surplus (the passing task aside) stops the spin. */
static int cores_oversubscribed(long long now, int ncpu)
{
	return tasks_over_cpus(now, ncpu) > 1;
}

static int cpus_online(void)
{
	static int ncpu;

	if (!ncpu)
		ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	return ncpu;
}

/*
 * CPUs this process may run on (taskset, a container's cpuset), re-read at
 * most every 50 ms since the mask may change.  Pinned to one CPU, a waiter
 * that spins only keeps its peer from running there: measured with a client
 * and server both on one CPU, a third of the CPU went to spinning.
 */
static int cpus_allowed(long long now)
{
	static _Atomic long long checked_at;
	static _Atomic int allowed;
	cpu_set_t set;

	if (now - atomic_load_explicit(&checked_at, memory_order_relaxed) < 50000000LL &&
	    atomic_load_explicit(&allowed, memory_order_relaxed))
		return atomic_load_explicit(&allowed, memory_order_relaxed);
	atomic_store(&checked_at, now);
	atomic_store(&allowed, sched_getaffinity(0, sizeof(set), &set) == 0 ?
	             CPU_COUNT(&set) : cpus_online());
	return atomic_load(&allowed);
}

/*
 * Short-lived connections leave acceleration on a surer sign than spinning
 * does: an idle machine running a client and a server that both spin counts
 * up to ncpu + 2 now and then (measured during make bench), a machine
 * beside busy loops more.  A process allowed a single CPU counts as busy
 * whatever the load: its peer, if it shares that CPU, runs only when it
 * does not, so CPU time is what a connection costs there too.
 */
int cores_busy(void)
{
	long long now = spin_now();

	return cpus_allowed(now) < 2 || tasks_over_cpus(now, cpus_online()) > 2;
}

static long long spin_deadline_after(long long ns)
{
	int ncpu = cpus_online();
	long long now = spin_now();

	if (ncpu < 2 || cpus_allowed(now) < 2)
		return 0;
	if (cores_oversubscribed(now, ncpu))
		return 0;
	if (deferred_run())             /* in time we would spend spinning */
		now = spin_now();
	return now + ns;
}

long long spin_deadline(void)
{
	return spin_deadline_after(SPIN_NS);
}

int spin_for_word(const _Atomic uint32_t *word, uint32_t seen, long long ns)
{
	long long until = spin_deadline_after(ns);

	if (!until)
		return 0;
	do {
		for (int i = 0; i < 64; i++) {
			if (atomic_load_explicit(word, memory_order_acquire) != seen)
				return 1;
			__builtin_ia32_pause();
		}
	} while (spin_now() < until);
	return 0;
}

int spin_for_change(int nonblock, const _Atomic uint64_t *word, uint64_t seen,
                    const _Atomic uint32_t *flags)
{
	long long until;

	if (nonblock || !(until = spin_deadline()))
		return 0;
	do {
		/* clock_gettime is a vDSO call, still worth amortising */
		for (int i = 0; i < 64; i++) {
			if (atomic_load_explicit(word, memory_order_relaxed) != seen ||
			    atomic_load_explicit(flags, memory_order_relaxed))
				return 1;
			__builtin_ia32_pause();
		}
	} while (spin_now() < until);
	return 0;
}

int spin_poll(int fd, short events)
{
	long long until = spin_deadline();
	struct pollfd p = { .fd = fd, .events = events };

	if (!until)
		return 0;
	do {
		if (sys_poll(&p, 1, 0) > 0)
			return 1;
	} while (spin_now() < until);
	return 0;
}
