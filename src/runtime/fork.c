/*
 * fork.c - the library's own fork handlers: the child is one more holder of
 * every connection (fd/fdfork.c), and what the handshake keeps per process
 * (pairs made ahead, closes put off, the connection table) is the parent's.
 *
 * Registered by the constructor (init.c).  The layers' locks are held
 * across fork by base/forkguard.c's handlers, registered after these by the
 * layers' constructors: prepare runs after theirs, parent and child before.
 */
#include "runtime.h"

#include "deferred.h"
#include "fdtab.h"
#include "handshake.h"
#include "pairs.h"
#include "stats.h"
#include "sys.h"

#include <pthread.h>

/* Parent and child never offer the same pair made ahead (pairs.h). */
static void runtime_fork_prepare(void)
{
	if (smclo_active) {
		pairs_drop();
		stats_table_note_fork();
	}
	fdfork_prepare();
}

static void runtime_fork_parent(void)
{
	fdfork_parent();
}

static void runtime_fork_child(void)
{
	sys_pid_forget();
	(void)sys_getpid();     /* filled now: never left for a vfork child to fill */
	fdfork_child();
	if (!smclo_active)
		return;
	pairs_after_fork();
	deferred_after_fork();
	stats_forget_table();
	hs_after_fork();
}

void runtime_fork_register(void)
{
	pthread_atfork(runtime_fork_prepare, runtime_fork_parent, runtime_fork_child);
}
