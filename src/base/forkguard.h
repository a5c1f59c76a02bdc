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

/* Call once per mutex, from a constructor (not thread-safe by design). */
void fork_guard(pthread_mutex_t *m);

#endif
