/*
 * forkguard.h - keep library mutexes usable in a fork child.
 *
 * A fork() while another thread holds one of our locks would leave the
 * child's copy locked forever (only the forking thread exists there).  Each
 * guarded mutex is taken before fork and released after it, in parent and
 * child, by one set of pthread_atfork() handlers.
 */
#ifndef SMCLO_FORKGUARD_H
#define SMCLO_FORKGUARD_H

#include <pthread.h>

/*
 * The handlers take the guarded locks in the order of their @rank, lowest
 * first, and a thread that holds a guarded lock may take only locks of a
 * higher rank: otherwise it could hold one the forking thread waits for
 * while it waits for one the forking thread holds.  Calls go downward, so
 * an upper layer's locks rank first; within a layer, a lock held around
 * calls that take another ranks before it (direct.c's around inbox.c's).
 * Constructors run in link order, which is no order to rely on: the ranks
 * are.
 */
#define FORK_RANK_FRONT      0  /* the preload shim's */
#define FORK_RANK_HANDSHAKE 10  /* + 0 direct.c, + 1 and + 2 inbox.c */
#define FORK_RANK_CORE      20
#define FORK_RANK_REGISTRY  30

/* Call once per mutex, from a constructor (not thread-safe by design). */
void fork_guard(pthread_mutex_t *m, int rank);

#endif
