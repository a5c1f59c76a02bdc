/*
 * forkguard.c - the atfork handlers behind fork_guard() (see forkguard.h).
 */
#include "forkguard.h"

#include <stdlib.h>

#define GUARD_MAX 16

static struct guarded {
	pthread_mutex_t *m;
	int rank;
} guarded[GUARD_MAX];
static int n_guarded;

/* In rank order (forkguard.h), as every thread that nests them takes them. */
static void lock_all(void)
{
	for (int i = 0; i < n_guarded; i++)
		pthread_mutex_lock(guarded[i].m);
}

static void unlock_all(void)
{
	for (int i = n_guarded - 1; i >= 0; i--)
		pthread_mutex_unlock(guarded[i].m);
}

void fork_guard(pthread_mutex_t *m, int rank)
{
	int i;

	if (n_guarded == 0)
		pthread_atfork(lock_all, unlock_all, unlock_all);
	if (n_guarded == GUARD_MAX)
		abort();        /* a lock left unguarded would deadlock some fork child */
	/* kept sorted; equal ranks in the order they came */
	for (i = n_guarded; i > 0 && guarded[i - 1].rank > rank; i--)
		guarded[i] = guarded[i - 1];
	guarded[i] = (struct guarded){ m, rank };
	n_guarded++;
}
