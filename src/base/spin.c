/*
 * spin.c - bounded busy-wait before a blocking sleep (see spin.h).
 */
#include "spin.h"

#include "cpus.h"
#include "sys.h"

#include <poll.h>
#include <sched.h>

static _Atomic int forbidden;

/*
 * How a waiter watches (SPIN_*, spin.h).  A spinning waiter only steals
 * time from the peer it waits for: only a clear surplus (the passing task
 * aside) stops it.  Under a cgroup quota it still pays (measured: ping-pong
 * 0.04x of TCP under a quota of one CPU): the peer runs meanwhile on
 * another CPU.  Confined to one CPU (taskset, a cpuset, a machine of one),
 * what pays depends on where the peer runs, not on this process's
 * affinity: on another CPU the peer writes while we watch; on ours, every
 * moment spent watching is a moment it cannot run - so we yield the CPU
 * to it between looks (measured pinned together: a 64 B round trip 2.5 us
 * for iceoryx2's yielding poll, 4.8 us for a futex sleep and wake-up).
 */
static int spin_way(long long now, uint32_t peer_cpu)
{
	if (cpus_surplus(now) > 1)
		return SPIN_OFF;
	if (cpus_online() >= 2 && cpus_allowed(now) >= 2)
		return SPIN_BUSY;
	if (!peer_cpu)
		return SPIN_OFF;
	return peer_cpu != spin_cpu_tag() ? SPIN_BUSY : SPIN_YIELD;
}

uint32_t spin_cpu_tag(void)
{
	int cpu;

	/* glibc reads the rseq area, else the vDSO; where neither serves it
	 * makes a system call, which a confined process must not (spin_forbid) */
	if (atomic_load_explicit(&forbidden, memory_order_relaxed))
		return 0;
	cpu = sched_getcpu();
	return cpu < 0 ? 0 : (uint32_t)cpu + 1;
}

int spin_confined(void)
{
	return cpus_online() < 2 || cpus_allowed(mono_now_ns()) < 2;
}

uint32_t spin_peer_pick(uint32_t picked, uint32_t peer, uint32_t mine)
{
	if (picked && picked != mine)
		return picked;
	return peer ? peer : picked;
}

void spin_note_cpu(_Atomic uint32_t *slot)
{
	uint32_t tag = spin_cpu_tag();

	/* written only when it changes: the line is the peer's to read */
	if (atomic_load_explicit(slot, memory_order_relaxed) != tag)
		atomic_store_explicit(slot, tag, memory_order_relaxed);
}

static int (*idle_work)(void);

void spin_set_idle_work(int (*fn)(void))
{
	idle_work = fn;
}

void spin_forbid(void)
{
	atomic_store(&forbidden, 1);
}

static long long spin_deadline_after(long long ns, uint32_t peer_cpu, int *way)
{
	long long now = mono_now_ns();

	*way = atomic_load_explicit(&forbidden, memory_order_relaxed) ? SPIN_OFF
	                                                              : spin_way(now, peer_cpu);
	if (*way == SPIN_OFF)
		return 0;
	/* in time we would spend spinning: the upper layers' work put off */
	if (idle_work && idle_work())
		now = mono_now_ns();
	return now + ns;
}

long long spin_deadline(uint32_t peer_cpu, int *way)
{
	return spin_deadline_after(SPIN_NS, peer_cpu, way);
}

int spin_looks(int way, int busy)
{
	return way == SPIN_YIELD ? 1 : busy;
}

void spin_relax(int way)
{
	if (way == SPIN_YIELD)
		sched_yield();
	else
		__builtin_ia32_pause();
}

int spin_for_word(const _Atomic uint32_t *word, uint32_t seen, long long ns)
{
	int way;
	long long until = spin_deadline_after(ns, 0, &way);

	if (!until)
		return 0;
	do {
		for (int i = 0; i < spin_looks(way, 64); i++) {
			if (atomic_load_explicit(word, memory_order_acquire) != seen)
				return 1;
			spin_relax(way);
		}
	} while (mono_now_ns() < until);
	return 0;
}

int spin_for_change(int nonblock, uint32_t peer_cpu, const _Atomic uint64_t *word, uint64_t seen,
                    const _Atomic uint32_t *flags)
{
	long long until;
	int way;

	if (nonblock || !(until = spin_deadline(peer_cpu, &way)))
		return 0;
	do {
		/* clock_gettime is a vDSO call, still worth amortising */
		for (int i = 0; i < spin_looks(way, 64); i++) {
			if (atomic_load_explicit(word, memory_order_relaxed) != seen ||
			    atomic_load_explicit(flags, memory_order_relaxed))
				return 1;
			spin_relax(way);
		}
	} while (mono_now_ns() < until);
	return 0;
}

int spin_poll(int fd, short events)
{
	int way;
	long long until = spin_deadline(0, &way);
	struct pollfd p = { .fd = fd, .events = events };

	if (!until)
		return 0;
	do {
		if (sys_poll(&p, 1, 0) > 0)
			return 1;
	} while (mono_now_ns() < until);
	return 0;
}
