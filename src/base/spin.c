/*
 * spin.c - bounded busy-wait before a blocking sleep (see spin.h).
 */
#include "spin.h"

#include "cpus.h"
#include "sys.h"

#include <poll.h>

/* A spinning waiter only steals time from the peer it waits for: only a
 * clear surplus (the passing task aside) stops the spin.  Under a cgroup
 * quota it still pays (measured: ping-pong 0.04x of TCP under a quota of one
 * CPU): the peer runs meanwhile on another CPU. */
static int spin_pays(long long now)
{
	return cpus_online() >= 2 && cpus_allowed(now) >= 2 && cpus_surplus(now) <= 1;
}

static int (*idle_work)(void);

void spin_set_idle_work(int (*fn)(void))
{
	idle_work = fn;
}

static _Atomic int forbidden;

void spin_forbid(void)
{
	atomic_store(&forbidden, 1);
}

static long long spin_deadline_after(long long ns)
{
	long long now = mono_now_ns();

	if (atomic_load_explicit(&forbidden, memory_order_relaxed) || !spin_pays(now))
		return 0;
	/* in time we would spend spinning: the upper layers' work put off */
	if (idle_work && idle_work())
		now = mono_now_ns();
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
	} while (mono_now_ns() < until);
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
	} while (mono_now_ns() < until);
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
	} while (mono_now_ns() < until);
	return 0;
}
