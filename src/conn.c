/*
 * conn.c - the descriptor table, connection objects and their memory.
 *
 * The table is indexed by descriptor and sized to the hard descriptor limit
 * (reserved, not committed, so it costs only the pages that are touched).
 * Lookups on the data path are one atomic load; a reference count keeps a
 * connection alive while another thread closes its descriptor.  Connection
 * objects are never returned to the heap, only recycled, so a lookup racing
 * with a close never touches freed memory.
 */
#include "conn.h"

#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

int smclo_active;
int registry_fd = -1;
struct stats_totals *totals;

struct fd_entry {
	_Atomic(struct conn *) conn;
	_Atomic uint8_t flags;
	int listen_lock;                /* lock fd of our listener entry, +1 (0 = none) */
};

static struct fd_entry *fdtab;
static int fdtab_size;
static int hide_base;
static _Atomic int n_conns;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn *pool;           /* recycled objects, linked through ->tx */

int fdtab_init(void)
{
	struct rlimit rl;
	size_t len;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -1;
	fdtab_size = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 22) ?
	             (1 << 22) : (int)rl.rlim_max;
	len = (size_t)fdtab_size * sizeof(*fdtab);
	fdtab = mmap(NULL, len, PROT_READ | PROT_WRITE,
	             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (fdtab == MAP_FAILED) {
		fdtab = NULL;
		return -1;
	}
	/* hidden descriptors sit in the top half of the soft limit */
	hide_base = rl.rlim_cur > 64 && rl.rlim_cur != RLIM_INFINITY ?
	            (int)(rl.rlim_cur / 2) : 512;
	return 0;
}

static struct fd_entry *ent(int fd)
{
	return (fdtab && fd >= 0 && fd < fdtab_size) ? &fdtab[fd] : NULL;
}

uint8_t fd_flags(int fd)
{
	struct fd_entry *e = ent(fd);

	return e ? atomic_load_explicit(&e->flags, memory_order_relaxed) : 0;
}

void fd_set_flags(int fd, uint8_t flags)
{
	struct fd_entry *e = ent(fd);

	if (e)
		atomic_store(&e->flags, flags);
}

void fd_set_listen_lock(int fd, int lockfd)
{
	struct fd_entry *e = ent(fd);

	if (e)
		e->listen_lock = lockfd + 1;
}

int fd_take_listen_lock(int fd)
{
	struct fd_entry *e = ent(fd);
	int l;

	if (!e)
		return -1;
	l = e->listen_lock - 1;
	e->listen_lock = 0;
	return l;
}

int fd_has_conn(int fd)
{
	struct fd_entry *e = ent(fd);

	return e && atomic_load_explicit(&e->conn, memory_order_acquire) != NULL;
}

struct conn *conn_get(int fd)
{
	struct fd_entry *e = ent(fd);
	struct conn *c;

	if (!e)
		return NULL;
	for (;;) {
		c = atomic_load_explicit(&e->conn, memory_order_acquire);
		if (!c)
			return NULL;
		atomic_fetch_add(&c->refs, 1);
		if (atomic_load(&e->conn) == c)
			return c;
		conn_put(c);     /* closed (and maybe recycled) under us: look again */
	}
}

static void conn_free(struct conn *c)
{
	if (c->tx)
		munmap(c->tx, ring_region_len(c->tx_size));
	if (c->rx)
		munmap((void *)c->rx, ring_region_len(c->rx_size));
	if (c->sh)
		munmap(c->sh, sizeof(*c->sh));
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
	atomic_fetch_add(&n_conns, 1);
	return c;
}

int conn_count(void)
{
	return atomic_load(&n_conns);
}

void conn_bind_fd(struct conn *c, int fd)
{
	struct fd_entry *e = ent(fd);
	struct conn *old;

	if (!e)
		return;
	atomic_fetch_add(&c->refs, 1);
	c->fd_count++;
	old = atomic_exchange(&e->conn, c);
	if (old) {          /* dup2 over a connection: that descriptor is gone */
		old->fd_count--;
		conn_put(old);
	}
}

struct conn *conn_unbind_fd(int fd)
{
	struct fd_entry *e = ent(fd);
	struct conn *c;

	if (!e)
		return NULL;
	atomic_store(&e->flags, 0);
	c = atomic_exchange(&e->conn, NULL);
	if (c)
		c->fd_count--;
	return c;
}

void conn_for_each_fd(void (*fn)(int fd, struct conn *c, void *arg), void *arg)
{
	for (int fd = 0; fdtab && fd < fdtab_size; fd++) {
		struct conn *c = atomic_load(&fdtab[fd].conn);
		if (c)
			fn(fd, c, arg);
	}
}

static void robust_init(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;

	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

struct conn_shared *conn_shared_new(void)
{
	struct conn_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
	                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (sh == MAP_FAILED)
		return NULL;
	robust_init(&sh->tx_lock);
	robust_init(&sh->rx_lock);
	sh->holders = 1;
	return sh;
}

void sh_lock(pthread_mutex_t *m)
{
	/* a holder killed mid-operation leaves cursors consistent: they are
	 * only ever advanced after the bytes they cover were copied */
	if (pthread_mutex_lock(m) == EOWNERDEAD)
		pthread_mutex_consistent(m);
}

void sh_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
}

struct ring_hdr *ring_create(uint32_t size, int *memfd)
{
	size_t len = ring_region_len(size);
	struct ring_hdr *h;
	int fd = memfd_create("smclo-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t)len) < 0)
		goto fail;
	h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED)
		goto fail;
	ring_hdr_init(h, size);
	/*
	 * Fixed size (no SIGBUS from a truncation) and no writable mapping for
	 * anyone who gets the descriptor later: the peer can only read.
	 */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
	          F_SEAL_SEAL) < 0) {
		munmap(h, len);
		goto fail;
	}
	*memfd = fd;
	return h;
fail:
	sys_close(fd);
	return NULL;
}

const struct ring_hdr *ring_map_peer(int memfd, uint32_t size, uint32_t use, uid_t *owner)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	struct stat st;
	void *p;
	int seals = fcntl(memfd, F_GET_SEALS);

	/* a region the peer could still shrink could SIGBUS us */
	if (seals < 0 || (seals & need) != need || use > size || !ring_size_valid(use))
		return NULL;
	if (fstat(memfd, &st) < 0 || (size_t)st.st_size != ring_region_len(size))
		return NULL;
	p = mmap(NULL, ring_region_len(use), PROT_READ, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (ring_hdr_check(p, size) < 0) {
		munmap(p, ring_region_len(use));
		return NULL;
	}
	*owner = st.st_uid;
	return p;
}

int fd_dup_hidden(int fd)
{
	int h = sys_fcntl(fd, F_DUPFD_CLOEXEC, hide_base);

	return h >= 0 ? h : sys_fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

int fd_hide(int fd)
{
	int h = fd_dup_hidden(fd);

	if (h < 0)
		return fd;
	sys_close(fd);
	return h;
}
