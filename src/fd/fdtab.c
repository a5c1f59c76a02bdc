/*
 * fdtab.c - the descriptor table (fdtab.h): one entry per descriptor
 * number, the descriptor budget, and smclo's own hidden descriptors.
 *
 * The table is indexed by descriptor and sized to the hard descriptor limit
 * (reserved, not committed, so it costs only the pages that are touched).
 * Lookups on the data path are one atomic load; a reference count keeps a
 * connection alive while another thread closes its descriptor (conn.c
 * recycles connection objects, never frees them, so a lookup racing with a
 * close never touches freed memory).
 */
#include "fdtab.h"

#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

int smclo_active;
int fd_budget_small;

int fd_budget_is_small(void)
{
	return fd_budget_small;
}
int fd_soft_limit = 1024;
_Atomic int fd_options_shared;

struct fd_entry *fdtab;
int fdtab_size;
static _Atomic int fd_high;         /* no entry above this was ever used: walks stop here */
static int hide_base;
static _Atomic uint64_t *ours_bits;         /* fd_mark_ours: one bit per number */

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
	ours_bits = mmap(NULL, ((size_t)fdtab_size + 63) / 64 * sizeof(*ours_bits),
	                 PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (ours_bits == MAP_FAILED)
		ours_bits = NULL;       /* close_range() then keeps only the registry's */
	fd_limit_changed();
	return 0;
}

void fdtab_activate(void)
{
	smclo_active = 1;
}

void fd_limit_changed(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	/* hidden descriptors sit in the top half of the soft limit */
	hide_base = rl.rlim_cur > 64 && rl.rlim_cur != RLIM_INFINITY ?
	            (int)(rl.rlim_cur / 2) : 512;
	fd_budget_small = rl.rlim_cur < 512;
	fd_soft_limit = rl.rlim_cur > INT_MAX ? INT_MAX : (int)rl.rlim_cur;
}

/* An entry about to be written: walks must reach it. */
static struct fd_entry *ent_use(int fd)
{
	struct fd_entry *e = fd_entry(fd);
	int high = atomic_load_explicit(&fd_high, memory_order_relaxed);

	while (e && fd > high &&
	       !atomic_compare_exchange_weak(&fd_high, &high, fd))
		;
	return e;
}

void fd_epoll_early(int fd, int delta)
{
	struct fd_entry *e = delta > 0 ? ent_use(fd) : fd_entry(fd);

	if (!e)
		return;
	if (delta > 0)
		atomic_fetch_add_explicit(&e->epoll_early, 1, memory_order_relaxed);
	else if (delta == 0)
		atomic_store_explicit(&e->epoll_early, 0, memory_order_relaxed);
	else if (atomic_load_explicit(&e->epoll_early, memory_order_relaxed))
		atomic_fetch_sub_explicit(&e->epoll_early, 1, memory_order_relaxed);
}

void fd_set_flags(int fd, uint16_t flags)
{
	struct fd_entry *e = ent_use(fd);

	if (e)
		atomic_store_explicit(&e->flags, flags, memory_order_release);
}

void fd_add_flags(int fd, uint16_t flags)
{
	struct fd_entry *e = ent_use(fd);

	if (e)
		atomic_fetch_or(&e->flags, flags);
}

void fd_clear_flags(int fd, uint16_t flags)
{
	struct fd_entry *e = fd_entry(fd);

	if (e)
		atomic_fetch_and(&e->flags, (uint16_t)~flags);
}

void fd_set_listen_lock(int fd, int lockfd)
{
	struct fd_entry *e = ent_use(fd);

	if (e)
		e->listen_lock = lockfd + 1;
}

int fd_take_listen_lock(int fd)
{
	struct fd_entry *e = fd_entry(fd);
	int l;

	if (!e)
		return -1;
	l = e->listen_lock - 1;
	e->listen_lock = 0;
	return l;
}

int fd_kernel_accepts(int fd, int delta)
{
	struct fd_entry *e = fd_entry(fd);

	if (!e)
		return 0;
	if (!delta)
		return atomic_load(&e->kernel_accepts);
	return (uint16_t)(atomic_fetch_add(&e->kernel_accepts, (uint16_t)delta) + delta);
}

/* The connection @e names, with a reference, or NULL. */
static struct conn *entry_conn_get(struct fd_entry *e)
{
	for (;;) {
		struct conn *c = atomic_load_explicit(&e->conn, memory_order_acquire);

		if (!c)
			return NULL;
		if (!conn_try_ref(c)) {
			if (atomic_load(&e->conn) == c)
				return NULL;    /* cannot be: the entry holds a reference */
			continue;        /* freed under us: the entry names another now */
		}
		if (atomic_load(&e->conn) == c)
			return c;
		conn_put(c);     /* closed (and maybe recycled) under us: look again */
	}
}

struct conn *fd_get_conn(int fd)
{
	struct fd_entry *e = fd_entry(fd);

	return e ? entry_conn_get(e) : NULL;
}

void fd_bind_conn(struct conn *c, int fd)
{
	struct fd_entry *e = ent_use(fd);
	struct conn *old;

	if (!e)
		return;
	atomic_fetch_add(&c->refs, 1);
	c->fd_count++;
	if (c->mode == MODE_SHM && c->bell_fd < 0 && !c->bell_ino)
		conn_note_bell(c, fd);
	old = atomic_exchange(&e->conn, c);
	if (old) {          /* dup2 over a connection: that descriptor is gone */
		old->fd_count--;
		conn_put(old);
	}
}

struct conn *fd_unbind_conn(int fd)
{
	struct fd_entry *e = fd_entry(fd);
	struct conn *c;

	if (!e)
		return NULL;
	atomic_store(&e->flags, 0);
	c = atomic_exchange(&e->conn, NULL);
	if (c)
		c->fd_count--;
	return c;
}

int fd_table_high(void)
{
	return atomic_load(&fd_high);
}

void fd_for_each_conn(void (*fn)(int fd, struct conn *c, void *arg), void *arg)
{
	int high = atomic_load(&fd_high);

	/* no reference for @fn: the fork handlers walk with every guarded
	 * lock held, where dropping a last reference (conn_free) would
	 * deadlock */
	for (int fd = 0; fdtab && fd <= high && fd < fdtab_size; fd++) {
		struct conn *c = atomic_load(&fdtab[fd].conn);
		if (c)
			fn(fd, c, arg);
	}
}

int fd_listener_copy(int fd)
{
	int high = atomic_load(&fd_high);
	struct stat a, b;

	if (fstat(fd, &a) < 0)
		return -1;
	for (int i = 0; fdtab && i <= high && i < fdtab_size; i++)
		if (i != fd && !fdtab[i].listen_lock &&
		    (atomic_load(&fdtab[i].flags) & FDF_LISTENING) && fstat(i, &b) == 0 &&
		    a.st_ino == b.st_ino && a.st_dev == b.st_dev)
			return i;
	return -1;
}

void fd_for_each_listener(void (*fn)(int fd))
{
	int high = atomic_load(&fd_high);

	for (int fd = 0; fdtab && fd <= high && fd < fdtab_size; fd++)
		if (fdtab[fd].listen_lock)
			fn(fd);
}

/*
 * Remember which file @fd names.  smclo closes its descriptors with the raw
 * system call from many places, so a mark is not always taken back there:
 * the file's identity tells a mark still true from a number handed out
 * again.  The marks live beside the table entries, with one bit each in
 * ours_bits so that close_range() finds them without walking the hidden
 * range (they do not move fd_high: the walks over the program's
 * descriptors stay as short as the program's range).
 */
static void ours_bit(int fd, int on)
{
	uint64_t m = 1ull << (fd % 64);

	if (!ours_bits)
		return;
	if (on)
		atomic_fetch_or_explicit(&ours_bits[fd / 64], m, memory_order_release);
	else
		atomic_fetch_and_explicit(&ours_bits[fd / 64], ~m, memory_order_release);
}

static void fd_mark_ours(int fd)
{
	struct fd_entry *e = fd_entry(fd);
	struct stat st;

	if (!e || fstat(fd, &st) < 0)
		return;
	atomic_store_explicit(&e->ours_dev, (uint32_t)st.st_dev, memory_order_relaxed);
	atomic_store_explicit(&e->ours_ino, (uint64_t)st.st_ino, memory_order_release);
	ours_bit(fd, 1);
}

void fd_forget_ours(int fd)
{
	struct fd_entry *e = fd_entry(fd);

	if (!e)
		return;
	atomic_store_explicit(&e->ours_ino, 0, memory_order_relaxed);
	ours_bit(fd, 0);
}

int fd_is_ours(int fd)
{
	struct fd_entry *e = fd_entry(fd);
	struct stat st;
	uint64_t ino;

	if (fd >= 0 && fd == registry_fd)
		return 1;       /* also above the table (a soft limit past 8M) */
	if (!e || !(ino = atomic_load_explicit(&e->ours_ino, memory_order_acquire)))
		return 0;
	/* a number the program holds a connection or socket of ours under is
	 * the program's, whatever file it names (a hidden end dup3'd into its
	 * place, then copied by the program to this number) */
	if (!fd_has_conn(fd) && !fd_flags(fd) && fstat(fd, &st) == 0 &&
	    (uint64_t)st.st_ino == ino &&
	    (uint32_t)st.st_dev == atomic_load_explicit(&e->ours_dev, memory_order_relaxed))
		return 1;
	/* smclo closed it since; the number names someone else's file now */
	if (atomic_compare_exchange_strong(&e->ours_ino, &ino, 0))
		ours_bit(fd, 0);
	return 0;
}

int fd_next_ours(unsigned from, unsigned last)
{
	unsigned end = (unsigned)fdtab_size - 1;

	if (!ours_bits || fdtab_size <= 0 || from > end)
		return -1;
	if (last < end)
		end = last;
	for (unsigned w = from / 64; w <= end / 64; w++) {
		uint64_t bits = atomic_load_explicit(&ours_bits[w], memory_order_acquire);

		if (w == from / 64)
			bits &= ~0ull << (from % 64);
		if (bits) {
			unsigned fd = w * 64 + (unsigned)__builtin_ctzll(bits);
			return fd <= end ? (int)fd : -1;
		}
	}
	return -1;
}

int fd_dup_hidden(int fd)
{
	int h = sys_fcntl(fd, F_DUPFD_CLOEXEC, hide_base);

	if (h < 0)
		h = sys_fcntl(fd, F_DUPFD_CLOEXEC, 3);
	fd_mark_ours(h);
	return h;
}

int fd_keep_copy(int fd, int if_spare)
{
	int h;

	/* a server's descriptors are its capacity: an eighth of them at most
	 * go to copies kept for a hand-over */
	if (if_spare && (fd_budget_small || conn_count() * 8 > fd_soft_limit))
		return -1;
	h = fd_dup_hidden(fd);
	if (if_spare && h >= 0 && !fd_is_hidden(h)) {
		sys_close(h);   /* it would take one of the program's numbers */
		h = -1;
	}
	return h;
}

int fd_is_hidden(int fd)
{
	return fd >= hide_base;
}

int fd_hide(int fd)
{
	int h = fd_dup_hidden(fd);

	if (h < 0) {
		fd_mark_ours(fd);
		return fd;
	}
	sys_close(fd);
	return h;
}
