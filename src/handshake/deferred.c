/*
 * deferred.c - closes put off to a moment a thread spends waiting anyway
 * (see deferred.h).
 *
 * A short array under a spinning lock: the deferred closes are few (one
 * per closed connection between two waits) and the lock is held for a
 * copy, never across a system call.  When the array is full the close
 * happens at once, so nothing accumulates in a process that never waits.
 */
#include "deferred.h"

#include "spin.h"
#include "sys.h"

#include <stdatomic.h>

#define DEFERRED_MAX 16

static atomic_flag lock = ATOMIC_FLAG_INIT;
static int pending_fds[DEFERRED_MAX];
static _Atomic int npending;

void deferred_close(int fd)
{
	int queued = 0;

	spin_lock_take(&lock);
	if (npending < DEFERRED_MAX) {
		pending_fds[npending] = fd;
		atomic_store_explicit(&npending, npending + 1, memory_order_relaxed);
		queued = 1;
	}
	spin_lock_drop(&lock);
	if (!queued)
		sys_close(fd);
}

int deferred_run(void)
{
	int fds[DEFERRED_MAX], n;

	if (!atomic_load_explicit(&npending, memory_order_relaxed))
		return 0;
	spin_lock_take(&lock);
	n = npending;
	for (int i = 0; i < n; i++)
		fds[i] = pending_fds[i];
	atomic_store_explicit(&npending, 0, memory_order_relaxed);
	spin_lock_drop(&lock);
	for (int i = 0; i < n; i++)
		sys_close(fds[i]);
	return n;
}

void deferred_after_fork(void)
{
	atomic_flag_clear(&lock);       /* a thread of the parent may have held it */
	deferred_run();
}
