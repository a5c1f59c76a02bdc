/*
 * stats.c - per-process connection tables and registry-wide totals (stats.h).
 */
#include "stats.h"

#include "log.h"
#include "registry.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static struct stat_table *my_table;
static char my_table_name[64];
static int my_table_fd = -1;
static int (*keep_fd)(int fd);          /* stats_set_fd_keeper */
static int my_table_failed;     /* table_create() failed: do not retry per connection */
static int my_table_shared;     /* a fork child holds it too */
static struct stats_totals *my_totals;  /* what stats_totals_map gave this process */

/* "t/<uid>": each user's totals, written by nobody else (registry_open_mappable). */
static void totals_path(char out[REGISTRY_PATH_MAX], uid_t uid)
{
	char name[16];

	snprintf(name, sizeof(name), "%u", (unsigned)uid);
	registry_entry_path(out, "t", name);
}

struct stats_totals *totals;

struct stats_totals *stats_totals_map(int dirfd)
{
	char path[REGISTRY_PATH_MAX];
	struct stats_totals *t;
	struct stat st;
	int fd;

	totals_path(path, geteuid());
	fd = registry_open_mappable(dirfd, path, geteuid());
	if (fd < 0)
		return NULL;
	/* whoever grows the file first initialises it; the lock orders the two */
	{
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
		fcntl(fd, F_OFD_SETLKW, &fl);
		if (fstat(fd, &st) == 0 && st.st_size < (off_t)sizeof(*t)) {
			t = registry_map_backed(fd, sizeof(*t));
			if (t) {
				t->magic = STATS_MAGIC;
				t->version = STATS_VERSION;
				t->created = time(NULL);
				t->reset = t->created;
				munmap(t, sizeof(*t));
			}
		}
		fl.l_type = F_UNLCK;
		fcntl(fd, F_OFD_SETLK, &fl);
	}
	t = registry_map_backed(fd, sizeof(*t));
	close(fd);
	/* a file another smclo version laid out differently is not ours to read */
	if (t && (t->magic != STATS_MAGIC || t->version != STATS_VERSION)) {
		munmap(t, sizeof(*t));
		errno = EPROTO;
		return NULL;
	}
	if (t && !my_totals)
		my_totals = t;
	return t;
}

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

/* Held across fork() (runtime/fork.c): the child's copy is then free. */
void stats_fork_lock(void)
{
	pthread_mutex_lock(&table_lock);
}

void stats_fork_unlock(void)
{
	pthread_mutex_unlock(&table_lock);
}

static int fold_if_dead(int dirfd, const char *sub, const char *name, void *arg);

/*
 * Make this process's table c/<pid>.<rand>, with table_lock held.  A
 * process that cannot (it dropped privileges below the registry's owner,
 * the filesystem is full) lists no connection in `smclo stat` and does not
 * try again for every connection; its totals still count.
 */
static void table_create(int dirfd)
{
	uint32_t rnd = 0;
	int fd;

	if (syscall(SYS_getrandom, &rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint32_t)time(NULL);
	snprintf(my_table_name, sizeof(my_table_name), "%d.%08x", (int)sys_getpid(), rnd);
	fd = registry_lock_create(dirfd, "c", my_table_name);
	if (fd >= 0 && !(my_table = registry_map_backed(fd, sizeof(struct stat_table)))) {
		registry_entry_remove(dirfd, "c", my_table_name);
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		my_table_failed = 1;
		DBG("no connection table in the registry (%s): connections are not listed",
		    strerror(errno));
		return;
	}
	my_table->magic = TABLE_MAGIC;
	my_table->pid = sys_getpid();
	my_table->nslots = TABLE_SLOTS;
	/* held open: the lock says we are alive - and kept from a daemon's
	 * close() loop, which would drop the lock and let others fold a live
	 * table away */
	my_table_fd = keep_fd ? keep_fd(fd) : fd;
	/*
	 * Tables of processes killed without a chance to remove theirs are
	 * folded in by whoever makes a table next (and by `smclo stat`), so
	 * a registry gives back what crashed processes left.
	 */
	if (my_totals)
		registry_for_each(dirfd, "c", fold_if_dead, my_totals);
}

struct stat_table *stats_table(int dirfd, char *name_out, size_t len)
{
	struct stat_table *t;

	pthread_mutex_lock(&table_lock);   /* first connections of several threads race here */
	if (!my_table && !my_table_failed)
		table_create(dirfd);
	if (my_table && name_out)
		snprintf(name_out, len, "%s", my_table_name);
	t = my_table;
	pthread_mutex_unlock(&table_lock);
	return t;
}

void stats_set_fd_keeper(int (*keep)(int fd))
{
	keep_fd = keep;
}

void stats_forget_table(void)
{
	/* in a fork child, under table_lock: the forking thread took it
	 * (stats_fork_lock) and gives it back after this (stats_fork_unlock) */
	/*
	 * The child keeps the parent's mapping and lock descriptor: slots of
	 * connections it inherited stay where they are, and the parent's table
	 * stays alive while either process lives.
	 */
	my_table = NULL;
	my_table_fd = -1;
	my_table_failed = 0;
	my_table_shared = 0;
}

void stats_table_note_fork(void)
{
	if (my_table)
		my_table_shared = 1;
}

void stats_table_remove_at_exit(int dirfd)
{
	if (!my_table || my_table_shared)
		return;
	for (uint32_t i = 0; i < TABLE_SLOTS; i++)
		if (atomic_load_explicit(&my_table->slots[i].in_use, memory_order_relaxed))
			return;         /* open connections: `smclo stats` folds them in */
	registry_entry_remove(dirfd, "c", my_table_name);
}

struct stat_slot *stats_slot_alloc(struct stat_table *t, int fd, int role)
{
	for (uint32_t i = 0; t && i < TABLE_SLOTS; i++) {
		struct stat_slot *s = &t->slots[i];
		uint32_t expect = 0;

		if (atomic_load_explicit(&s->in_use, memory_order_relaxed))
			continue;
		if (!atomic_compare_exchange_strong(&s->in_use, &expect, 1))
			continue;
		s->pid = sys_getpid();
		s->fd = fd;
		s->mode = MODE_PENDING;
		s->role = (uint8_t)role;
		s->reason = R_NONE;
		memset(&s->local, 0, sizeof(s->local));
		memset(&s->peer, 0, sizeof(s->peer));
		s->tx_ring = s->rx_ring = 0;
		s->tx_bytes = s->rx_bytes = 0;
		s->tx_fill = s->rx_fill = 0;
		s->bells_sent = s->bells_skipped = 0;
		s->started = (uint64_t)time(NULL);
		return s;
	}
	return NULL;   /* table full: the connection works, it is just not listed */
}

void stats_slot_decide(struct stats_totals *tot, struct stat_slot *s, int mode, int reason)
{
	if (s) {
		s->mode = (uint8_t)mode;
		s->reason = (uint16_t)reason;
	}
	if (!tot)
		return;
	if (mode == MODE_SHM)
		atomic_fetch_add(&tot->accelerated[s ? s->role : 0], 1);
	else if (reason > R_NONE && reason < R_COUNT)
		atomic_fetch_add(&tot->fallback[reason], 1);
	if (reason == R_HANDSHAKE_ERROR || reason == R_PROOF_FAILED)
		atomic_fetch_add(&tot->handshake_errors, 1);
}

/* Add @v to a shared total unless it is zero (a connection left on TCP
 * moved nothing through smclo: no need to take the line from the peer). */
static void add_nonzero(_Atomic uint64_t *total, uint64_t v)
{
	if (v)
		atomic_fetch_add(total, v);
}

static void fold(struct stats_totals *tot, struct stat_slot *s)
{
	if (tot) {
		add_nonzero(&tot->tx_bytes, atomic_load(&s->tx_bytes));
		add_nonzero(&tot->rx_bytes, atomic_load(&s->rx_bytes));
		add_nonzero(&tot->bells_sent, atomic_load(&s->bells_sent));
		add_nonzero(&tot->bells_skipped, atomic_load(&s->bells_skipped));
		atomic_fetch_add(&tot->conns_closed, 1);
	}
}

void stats_slot_release(struct stats_totals *tot, struct stat_slot *s)
{
	if (!s)
		return;
	fold(tot, s);
	atomic_store(&s->in_use, 0);
}

static int is_table_name(const char *n)
{
	return n[0] != '.';
}

/*
 * Other processes' files are read, never mapped: their owner could truncate
 * them while we look (a SIGBUS in a mapping, a short read here).  0 when
 * at least @least of the @len bytes were there (the rest zeroed).
 */
static int read_least(int dirfd, const char *path, void *buf, size_t len, size_t least)
{
	size_t got = 0;
	int fd = registry_open_read(dirfd, path);

	if (fd < 0)
		return -1;
	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)got);
		if (n <= 0 && !(n < 0 && errno == EINTR))
			break;
		if (n > 0)
			got += (size_t)n;
	}
	close(fd);
	if (got < least)
		return -1;
	if (got < len)
		memset((char *)buf + got, 0, len - got);
	return 0;
}

static int read_whole(int dirfd, const char *path, void *buf, size_t len)
{
	return read_least(dirfd, path, buf, len, len);
}

/* A copy of table @sub/@name, or NULL.  The caller frees it. */
static struct stat_table *table_copy(int dirfd, const char *path)
{
	struct stat_table *t = malloc(sizeof(*t));

	if (t && (read_whole(dirfd, path, t, sizeof(*t)) < 0 || t->magic != TABLE_MAGIC)) {
		free(t);
		t = NULL;
	}
	return t;
}

static int fold_if_dead(int dirfd, const char *sub, const char *name, void *arg)
{
	struct stats_totals *tot = arg;
	char from[300], to[300];
	struct stat_table *t;

	if (!is_table_name(name) || registry_is_locked(dirfd, sub, name) != 0)
		return 0;
	snprintf(from, sizeof(from), "%s/%s", sub, name);
	snprintf(to, sizeof(to), "%s/.dead.%d.%s", sub, (int)sys_getpid(), name);
	if (renameat(dirfd, from, dirfd, to) < 0)
		return 0;   /* someone else is folding it */
	t = table_copy(dirfd, to);
	if (t)
		for (uint32_t i = 0; i < TABLE_SLOTS; i++)
			if (atomic_load(&t->slots[i].in_use))
				fold(tot, &t->slots[i]);
	free(t);
	unlinkat(dirfd, to, 0);
	return 0;
}

void stats_collect_dead(int dirfd, struct stats_totals *tot)
{
	registry_for_each(dirfd, "c", fold_if_dead, tot);
}

struct visit {
	void (*fn)(const struct stat_slot *, void *);
	void *arg;
};

static int visit_table(int dirfd, const char *sub, const char *name, void *arg)
{
	struct visit *v = arg;
	char path[REGISTRY_PATH_MAX];
	struct stat_table *t;

	if (!is_table_name(name) || registry_entry_path(path, sub, name) < 0)
		return 0;
	t = table_copy(dirfd, path);
	if (t)
		for (uint32_t i = 0; i < TABLE_SLOTS; i++)
			if (atomic_load(&t->slots[i].in_use))
				v->fn(&t->slots[i], v->arg);
	free(t);
	return 0;
}

void stats_for_each(int dirfd, void (*fn)(const struct stat_slot *, void *), void *arg)
{
	struct visit v = { fn, arg };

	registry_for_each(dirfd, "c", visit_table, &v);
}

/* Every counter of the totals, in one list: resetting and summing walk it. */
#define TOTALS_COUNTERS_MAX (3 + 2 * STATS_REASONS + 18)
static int totals_counters(struct stats_totals *t, _Atomic uint64_t *c[TOTALS_COUNTERS_MAX])
{
	_Atomic uint64_t *scalars[] = {
		&t->handshake_errors, &t->tx_bytes, &t->rx_bytes, &t->conns_closed,
		&t->regions_created, &t->regions_reused, &t->bells_sent, &t->bells_skipped,
		&t->inbox_handshakes, &t->peer_regions_mapped, &t->peer_regions_kept,
		&t->direct_handshakes, &t->pool_sends_by_reference, &t->pool_sends_copied,
		&t->pool_sends_kernel, &t->pool_sends_reclaimed,
	};
	int n = 0;

	_Static_assert(3 + 2 * STATS_REASONS + sizeof(scalars) / sizeof(scalars[0]) <=
	               TOTALS_COUNTERS_MAX, "TOTALS_COUNTERS_MAX is too small");
	for (int i = 0; i < 3; i++)
		c[n++] = &t->accelerated[i];
	for (int i = 0; i < STATS_REASONS; i++)
		c[n++] = &t->fallback[i];
	for (int i = 0; i < STATS_REASONS; i++)
		c[n++] = &t->moved[i];
	for (size_t i = 0; i < sizeof(scalars) / sizeof(scalars[0]); i++)
		c[n++] = scalars[i];
	return n;
}

void stats_reset(struct stats_totals *tot)
{
	_Atomic uint64_t *c[TOTALS_COUNTERS_MAX];
	int n = totals_counters(tot, c);

	atomic_store(&tot->reset, (int64_t)time(NULL));
	for (int i = 0; i < n; i++)
		atomic_store(c[i], 0);
}

struct sum {
	struct stats_totals *out;
	int files;
};

static int add_totals(int dirfd, const char *sub, const char *name, void *arg)
{
	struct sum *sum = arg;
	char path[REGISTRY_PATH_MAX];
	struct stats_totals t;
	_Atomic uint64_t *from[TOTALS_COUNTERS_MAX], *to[TOTALS_COUNTERS_MAX];
	int n;

	if (registry_entry_path(path, sub, name) < 0 ||
	    /* a file laid out before `moved` was appended counts as it is */
	    read_least(dirfd, path, &t, sizeof(t), offsetof(struct stats_totals, moved)) < 0 ||
	    t.magic != STATS_MAGIC || t.version != STATS_VERSION)
		return 0;
	n = totals_counters(&t, from);
	totals_counters(sum->out, to);
	for (int i = 0; i < n; i++)
		atomic_fetch_add(to[i], atomic_load(from[i]));
	/* since the latest reset, every connection is in the sum */
	if (sum->files++ == 0 || t.reset > sum->out->reset)
		sum->out->reset = t.reset;
	return 0;
}

int stats_totals_sum(int dirfd, struct stats_totals *out)
{
	struct sum sum = { out, 0 };

	memset(out, 0, sizeof(*out));
	out->magic = STATS_MAGIC;
	out->version = STATS_VERSION;
	registry_for_each(dirfd, "t", add_totals, &sum);
	return sum.files;
}

uint64_t stats_fallbacks(const struct stats_totals *t)
{
	uint64_t all = 0;

	for (int r = R_NONE + 1; r < R_COUNT; r++)
		all += t->fallback[r];
	return all;
}

uint64_t stats_fallback_not_short_lived(const struct stats_totals *t)
{
	uint64_t short_lived = t->fallback[R_SHORT_LIVED];
	uint64_t no_smclo = t->fallback[R_PEER_NO_SMCLO];

	return stats_fallbacks(t) - short_lived - (no_smclo < short_lived ? no_smclo : short_lived);
}

void stats_attach_totals(const char *dir)
{
	totals = stats_totals_map(registry_fd);
	if (!totals && (errno == EPERM || errno == EPROTO))
		fprintf(stderr, "smclo: registry %s: t/%u must be " STATS_TOTALS_RULE "; this "
		        "process's connections are not counted in `smclo stats`\n",
		        dir, (unsigned)geteuid());
	else if (!totals)
		fprintf(stderr, "smclo: registry %s: cannot map t/%u: %s; this process's "
		        "connections are not counted in `smclo stats`\n",
		        dir, (unsigned)geteuid(), strerror(errno));
}

void stats_detach_totals(void)
{
	if (!totals)
		return;
	if (my_totals == totals)
		my_totals = NULL;
	munmap(totals, sizeof(*totals));
	totals = NULL;
}
