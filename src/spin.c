/*
 * spin.c - bounded busy-wait before a blocking sleep (see spin.h).
 */
#include "spin.h"

#include "sys.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static long long mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int spin_for_change(int fd, const _Atomic uint64_t *word, uint64_t seen,
                    const _Atomic uint32_t *flags)
{
	static int ncpu;
	long long until;

	if (!ncpu)
		ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 2 || (sys_fcntl(fd, F_GETFL, 0) & O_NONBLOCK))
		return 0;
	until = mono_ns() + SPIN_NS;
	do {
		/* clock_gettime is a vDSO call, still worth amortising */
		for (int i = 0; i < 64; i++) {
			if (atomic_load_explicit(word, memory_order_relaxed) != seen ||
			    atomic_load_explicit(flags, memory_order_relaxed))
				return 1;
			__builtin_ia32_pause();
		}
	} while (mono_ns() < until);
	return 0;
}
