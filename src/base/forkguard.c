/*
 * forkguard.c - the atfork handlers behind fork_guard() (see forkguard.h).
 */
#include "forkguard.h"

#include <stdlib.h>

#define GUARD_MAX 16

static pthread_mutex_t *guarded[GUARD_MAX];
static int n_guarded;

/* Always in the same order, so two forking threads cannot deadlock each other. */
static void lock_all(void)
{
	for (int i = 0; i < n_guarded; i++)
		pthread_mutex_lock(guarded[i]);
}

static void unlock_all(void)
{
	for (int i = n_guarded - 1; i >= 0; i--)
		pthread_mutex_unlock(guarded[i]);
}

void fork_guard(pthread_mutex_t *m)
{
	if (n_guarded == 0)
		pthread_atfork(lock_all, unlock_all, unlock_all);
	if (n_guarded == GUARD_MAX)
		abort();        /* a lock left unguarded would deadlock some fork child */
	guarded[n_guarded++] = m;
}
