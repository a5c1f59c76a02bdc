/*
 * conn.c - connection objects and their memory, and the locks every holder
 * of a connection shares.
 *
 * Connection objects are never returned to the heap, only recycled, so a
 * descriptor-table lookup racing with a close (fdtab.c) never touches freed
 * memory; a reference count keeps a connection alive while another thread
 * closes its descriptor.
 */
#include "conn.h"

#include "peerpool.h"
#include "region.h"

#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

static _Atomic int n_conns;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn *pool;           /* recycled objects, linked through ->tx */

static void conn_free(struct conn *c)
{
	peerpool_drop(c);
	if (c->region)
		region_put(c->region, c->reusable);
	if (c->sh)
		shared_put(c->sh, c->reusable);
	atomic_fetch_sub(&n_conns, 1);
	pthread_mutex_lock(&pool_lock);
	memset(c, 0, sizeof(*c));
	c->tx = (void *)pool;
	pool = c;
	pthread_mutex_unlock(&pool_lock);
}

void conn_put(struct conn *c)
{
	if (atomic_fetch_sub(&c->refs, 1) == 1)
		conn_free(c);
}

/*
 * A reference to @c unless it is already on its way to the free list.
 * Connections are recycled, never unmapped (conn.c's pool), so the count
 * may be read after a close: an increment from zero would bring a freed
 * connection back, and its conn_put free it twice.
 */
int conn_try_ref(struct conn *c)
{
	int r = atomic_load(&c->refs);

	while (r > 0)
		if (atomic_compare_exchange_weak(&c->refs, &r, r + 1))
			return 1;
	return 0;
}

int conn_put_unless_last(struct conn *c)
{
	int r = atomic_load(&c->refs);

	while (r > 1)
		if (atomic_compare_exchange_weak(&c->refs, &r, r - 1))
			return 1;
	return 0;
}

struct conn *conn_alloc(int mode)
{
	struct conn *c;

	pthread_mutex_lock(&pool_lock);
	c = pool;
	if (c)
		pool = (struct conn *)c->tx;
	pthread_mutex_unlock(&pool_lock);
	if (!c && !(c = calloc(1, sizeof(*c))))
		return NULL;
	memset(c, 0, sizeof(*c));
	c->refs = 1;
	c->mode = mode;
	c->tcp_fd = -1;
	c->bell_fd = -1;
	c->rx_pool_fd = c->pool_wake_fd = -1;
	atomic_fetch_add(&n_conns, 1);
	return c;
}

int conn_count(void)
{
	return atomic_load(&n_conns);
}

void conn_note_bell(struct conn *c, int fd)
{
	struct stat st;

	if (fstat(fd, &st) == 0)
		c->bell_ino = (unsigned long)st.st_ino;
}

/* Held across fork() (runtime/fork.c): the child's copy is then free. */
void conn_fork_lock(void)
{
	pthread_mutex_lock(&pool_lock);
}

void conn_fork_unlock(void)
{
	pthread_mutex_unlock(&pool_lock);
}

