/*
 * fork.c - the library's one set of fork handlers.
 *
 * A fork() while another thread holds one of the library's locks would
 * leave the child's copy locked for ever (only the forking thread exists
 * there), so every lock is taken before the fork and released after it, in
 * parent and child.  The order is this file's, not the order constructors or
 * first uses happened to register handlers in: a thread that holds a lock may
 * take only locks that come later in runtime_fork_prepare, so the fork takes
 * them in that order too.  Calls go downward, so an upper layer's locks come
 * first.  Before any lock, pending connections are decided (a child must not
 * inherit an undecided one); after every lock, the descriptor table counts
 * the child as one more holder of each connection (fd/fdfork.c).
 */
#include "runtime.h"

#include "conn.h"
#include "deferred.h"
#include "epoll_early.h"
#include "epoll_watch.h"
#include "fdtab.h"
#include "handshake.h"
#include "pairs.h"
#include "passfd.h"
#include "region.h"
#include "registry.h"
#include "shim.h"
#include "stats.h"
#include "sys.h"

#include <pthread.h>

/* Lowest layer last: the order every thread that nests them takes them in. */
static void runtime_fork_lock_layers(void)
{
	epoll_early_fork_lock();        /* shim: registrations made before connect() */
	epoll_watch_fork_prepare();     /* shim: the epoll sets' table, rings unwatched */
	spawn_fork_lock();              /* shim: posix_spawn's file actions */
	hs_fork_lock();                 /* handshake: direct.c's, inbox.c's */
	conn_fork_lock();               /* core: connection objects */
	region_fork_lock();             /* core: regions */
	shared_fork_lock();        /* core: shared-state chunks */
	registry_fork_lock();           /* registry: lookups */
	stats_fork_lock();              /* registry: this process's table */
}

static void runtime_fork_unlock_layers(void)
{
	stats_fork_unlock();
	registry_fork_unlock();
	shared_fork_unlock();
	region_fork_unlock();
	conn_fork_unlock();
	hs_fork_unlock();
	spawn_fork_unlock();
}

static void runtime_fork_prepare(void)
{
	hs_fork_decide();
	runtime_fork_lock_layers();
	if (smclo_active) {
		pairs_drop();           /* parent and child never offer the same pair */
		stats_table_note_fork();
	}
	fdfork_prepare();
}

static void runtime_fork_parent(void)
{
	fdfork_parent();
	runtime_fork_unlock_layers();
	epoll_watch_fork_parent();
	epoll_early_fork_unlock();
}

static void runtime_fork_child(void)
{
	sys_pid_forget();
	(void)sys_getpid();     /* filled now: never left for a vfork child to fill */
	fdfork_child();
	if (smclo_active) {
		pairs_after_fork();
		deferred_after_fork();
		stats_forget_table();
		hs_after_fork();
	}
	runtime_fork_unlock_layers();
	passfd_fork_child();
	epoll_watch_fork_child();
	epoll_early_fork_unlock();
}

void runtime_fork_register(void)
{
	pthread_atfork(runtime_fork_prepare, runtime_fork_parent, runtime_fork_child);
}
