/*
 * fdfork.c - fork and the connections of the descriptor table: the child is
 * one more holder of every connection it inherits.
 *
 * Called by the one set of fork handlers (runtime/fork.c), in their order:
 * fdfork_prepare last before the fork, with every layer's locks held,
 * fdfork_parent and fdfork_child first after it; and by the shim's fork()
 * (fdfork_begin, fdfork_end), which knows whether the fork failed.
 */
#include "fdtab.h"

#include "sys.h"

#include <stdlib.h>

static unsigned fork_generation;

/*
 * fork: the child becomes one more holder of every connection it inherits.
 * It is counted in the parent, before the fork.  Counted in the child, a
 * parent that closes its copy at once (socat fork, PostgreSQL, inetd,
 * ForkingTCPServer) could find itself the last holder before the child
 * counted, and close the connection under the child.  The counted
 * connections are kept (referenced) until the fork returns: a fork that
 * failed takes its counts back, a child that lost one to a racing close
 * gives its count back.
 */
static pthread_mutex_t fork_count_lock = PTHREAD_MUTEX_INITIALIZER;     /* two forking threads */
struct fork_counted {
	struct conn *c;         /* referenced until the fork returns */
	int holder;             /* counted as one more holder */
};
static struct fork_counted *fork_counted;
static int n_fork_counted, fork_counted_cap;
static __thread int in_fork_wrapper;

/*
 * The walk holds no reference and another thread may be closing @c: what
 * it reads before taking one is only a hint, the reference is taken from a
 * live connection only (a count taken from zero would bring a freed one
 * back, to be freed twice), and the test is made again under it.  A
 * reference taken for nothing is kept all the same when it is the last -
 * dropped here, with the layers' fork locks held (runtime/fork.c), it would free the
 * connection under them.
 */
static void fdfork_count_holder(int fd, struct conn *c, void *arg)
{
	if (c->mode != MODE_SHM || c->fork_gen == fork_generation)
		return;
	if (n_fork_counted == fork_counted_cap) {
		int cap = fork_counted_cap ? 2 * fork_counted_cap : 64;
		struct fork_counted *a = realloc(fork_counted, (size_t)cap * sizeof(*a));
		if (!a)
			return;         /* the child counts it, as a connection made meanwhile */
		fork_counted = a;
		fork_counted_cap = cap;
	}
	if (!conn_try_ref(c))
		return;
	if (c->mode != MODE_SHM || c->fork_gen == fork_generation) {
		if (conn_put_unless_last(c))
			return;
		fork_counted[n_fork_counted++] = (struct fork_counted){ c, 0 };
		return;
	}
	c->fork_gen = fork_generation;
	atomic_fetch_add(&c->sh->holders, 1);
	fork_counted[n_fork_counted++] = (struct fork_counted){ c, 1 };
}

/* After the fork, in the parent (@failed: no child) or the child. */
static void fdfork_settle(int failed, int in_child, int drop_refs)
{
	struct fork_counted *counted = fork_counted;
	int n = n_fork_counted;

	for (int i = 0; i < n; i++) {
		struct conn *c = counted[i].c;

		/* no child, or a thread closed every descriptor of it just before the fork */
		if (counted[i].holder && (failed || (in_child && c->fd_count == 0)))
			atomic_fetch_sub(&c->sh->holders, 1);
	}
	if (in_child) {
		/*
		 * The child keeps the references: the last one would free the
		 * object under locks runtime/fork.c may still hold, and what it
		 * points at is the parent's anyway.
		 */
		n_fork_counted = 0;
		/* the child's one thread is the one that took it (prepare) */
		pthread_mutex_unlock(&fork_count_lock);
		return;
	}
	/* the references are dropped after the lock is: freeing takes the
	 * pool's lock, which a thread forking meanwhile holds (runtime/fork.c)
	 * while it waits for ours */
	fork_counted = NULL;
	n_fork_counted = fork_counted_cap = 0;
	pthread_mutex_unlock(&fork_count_lock);
	for (int i = 0; drop_refs && i < n; i++)
		conn_put(counted[i].c);
	free(counted);
}

/* A connection bound while the fork was on its way: counted by the child. */
static void fdfork_child_counts_holder(int fd, struct conn *c, void *arg)
{
	c->inherited = 1;
	if (c->mode == MODE_SHM && c->fork_gen != fork_generation) {
		c->fork_gen = fork_generation;
		atomic_fetch_add(&c->sh->holders, 1);
	}
}

void fdfork_prepare(void)
{
	fd_options_shared = 1;
	if (!smclo_active)
		return;
	pthread_mutex_lock(&fork_count_lock);
	fork_generation++;
	fd_for_each_conn(fdfork_count_holder, NULL);
}

void fdfork_parent(void)
{
	/* a fork that did not come through ours (daemon(), forkpty()): the
	 * layers' fork locks may still be ours here, so the references stay */
	if (smclo_active && !in_fork_wrapper)
		fdfork_settle(0, 0, 0);
}

void fdfork_child(void)
{
	if (!smclo_active)
		return;
	in_fork_wrapper = 0;
	fdfork_settle(0, 1, 0);
	fd_for_each_conn(fdfork_child_counts_holder, NULL);
}

void fdfork_begin(void)
{
	in_fork_wrapper = 1;
}

void fdfork_end(int failed)
{
	in_fork_wrapper = 0;
	if (smclo_active)
		fdfork_settle(failed, 0, 1);
}
