/*
 * region.c - the pool of connection regions (see region.h).
 *
 * One list per process holds both kinds: regions we created (kept with
 * their memfd, to hand to the same peer again) and peers' regions we mapped
 * (kept with their identity, to recognise them).  The list is short (at
 * most KEEP_MINE + KEEP_THEIRS idle entries) and only touched at connect,
 * accept and close, so a mutex and a linear walk are all it needs.
 */
#include "region.h"

#include "conn.h"
#include "io.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

/*
 * Idle regions kept per process: of our own (our memory, held for reuse)
 * and of peers' (mappings of their memory, so a client that offers the same
 * region again costs no mmap/munmap - in a threaded server each munmap is a
 * TLB shootdown on every CPU its threads ran on, and the first touches of
 * a fresh mapping fault page by page).  A server that several clients'
 * pools reach (apache2's children, each getting any of ab's 20 regions)
 * needs more than its own pool does.  Ours: a region is idle but not yet
 * reusable until the server has closed its side, which a server that
 * closes after its client (apache2's lingering close) does a moment later;
 * with 8 kept, ab -c 20 found none reusable at its next connects, made new
 * ones and dropped the older ones (one connection in 11 made a region, and
 * each new one cost the server a mapping and the munmap of another).  32
 * hold two generations of 20 concurrent connections.  Their memory is only
 * what the connections touched (the rings' first pages, mostly).
 */
#define KEEP_MINE   32
#define KEEP_THEIRS 32

struct region {
	struct region *next;
	uint8_t *base;
	size_t len;
	uint32_t up, down;
	int mine;               /* created here (client) or mapped (server) */
	int memfd;              /* mine: the descriptor handed to the peer; theirs: kept
	                           to hand the connection to an exec'd program, or -1 */
	peerid peer;            /* mine: the only process it goes to; theirs: the
	                           client that made it, a PEERID_PID (NONE: not known) */
	uid_t creator;          /* mine: the uid the kernel reports as its owner */
	dev_t dev;              /* theirs: identity of the memfd */
	ino_t ino;
	pid_t owner;            /* the process whose list this is */
	int refs;               /* connections of this process using it */
	int closed_by_us;       /* mine: our side of its last connection is done */
	uint64_t idle_since;    /* LRU order among idle entries */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *list;
static uint64_t clock_ticks;

/* Held across fork() (runtime/fork.c): the child's copy is then free. */
void region_fork_lock(void)
{
	pthread_mutex_lock(&lock);
}

void region_fork_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

static size_t layout_len(uint32_t up, uint32_t down)
{
	return ring_region_len(up) + ring_region_len(down);
}

int region_mine(const struct region *r)
{
	return r->mine;
}

struct ring_hdr *region_up(struct region *r)
{
	return (struct ring_hdr *)r->base;
}

struct ring_hdr *region_down(struct region *r)
{
	return (struct ring_hdr *)(r->base + ring_region_len(r->up));
}

static void destroy(struct region *r)
{
	munmap(r->base, r->len);
	if (r->memfd >= 0)
		sys_close(r->memfd);
	free(r);
}

static void unlink_entry(struct region *r)
{
	for (struct region **pp = &list; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			return;
		}
}

/* Entries copied from a parent by fork are the parent's: never reuse them. */
static int usable(const struct region *r)
{
	return r->owner == sys_getpid() && r->refs == 0;
}

/*
 * Mine, idle, made under our current uid (the server checks the owner; a
 * process may have changed users since), and the peer has published CLOSED
 * on its last connection.
 */
static int reusable_for(const struct region *r, peerid peer, uid_t uid, uint32_t up,
                        uint32_t down)
{
	const struct ring_hdr *d;

	if (!r->mine || !usable(r) || !r->closed_by_us || peer == PEERID_NONE || r->peer != peer ||
	    r->creator != uid || r->up != up || r->down != down)
		return 0;
	d = (const struct ring_hdr *)(r->base + ring_region_len(up));
	return (atomic_load_explicit(&d->flags, memory_order_acquire) & RING_F_CLOSED) != 0;
}

static struct region *create(uint32_t up, uint32_t down)
{
	struct region *r = calloc(1, sizeof(*r));
	int fd = memfd_create("smclo-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (!r || fd < 0)
		goto fail;
	r->len = layout_len(up, down);
	if (ftruncate(fd, (off_t)r->len) < 0)
		goto fail;
	r->base = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r->base == MAP_FAILED)
		goto fail;
	/* fixed size: a mapping of it can never SIGBUS */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		munmap(r->base, r->len);
		goto fail;
	}
	r->memfd = io_keep_fd(fd);
	r->mine = 1;
	r->creator = geteuid();
	r->up = up;
	r->down = down;
	return r;
fail:
	if (fd >= 0)
		sys_close(fd);
	free(r);
	return NULL;
}

/*
 * Drop idle entries whose peer process is gone: nothing will ever reuse
 * them, and a server would otherwise keep the memory of clients that exited
 * (KEEP_THEIRS regions of them).  At most once a second: a kill(0) each.  Only
 * peers known by pid (peerid.h) can be asked; the others (in another PID
 * namespace, or keyed by pidfs inode or link) leave with the LRU (trim).
 */
static void drop_orphans(void)
{
	static long last_ms;
	long now = mono_now_ms();

	if (now - last_ms < 1000)
		return;
	last_ms = now;
	for (struct region *r = list, *next; r; r = next) {
		next = r->next;
		pid_t pid = peerid_pid(r->peer);

		if (r->refs == 0 && pid > 0 && r->owner == sys_getpid() &&
		    kill(pid, 0) < 0 && errno == ESRCH) {
			unlink_entry(r);
			destroy(r);
		}
	}
}

/* Drop the least recently idle entries of one kind (@mine) beyond @keep. */
static void trim_kind(int mine, int keep)
{
	for (;;) {
		struct region *old = NULL;
		int idle = 0;

		for (struct region *r = list; r; r = r->next)
			if (r->refs == 0 && r->mine == mine) {
				idle++;
				if (!old || r->idle_since < old->idle_since)
					old = r;
			}
		if (idle <= keep)
			return;
		unlink_entry(old);
		destroy(old);
	}
}

/* Drop what no one will reuse, and the oldest beyond the limits (lock held). */
static void trim(void)
{
	drop_orphans();
	trim_kind(1, KEEP_MINE);
	trim_kind(0, KEEP_THEIRS);
}

static void count(_Atomic uint64_t *counter)
{
	if (counter)
		atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

/*
 * The reusable region that went idle last (lock held): the regions in
 * circulation stay as few as the connections open at once, so the server's
 * kept mappings (KEEP_THEIRS) cover them; the first found took any, and
 * ab -c 20 went round more regions than apache2's children kept mapped.
 */
static struct region *most_recent_reusable(peerid peer, uid_t uid, uint32_t up, uint32_t down)
{
	struct region *best = NULL;

	for (struct region *r = list; r; r = r->next)
		if (reusable_for(r, peer, uid, up, down) && (!best || r->idle_since > best->idle_since))
			best = r;
	return best;
}

struct region *region_get(peerid peer, uint32_t up, uint32_t down, int *memfd)
{
	uid_t uid = geteuid();
	struct region *r;

	pthread_mutex_lock(&lock);
	r = most_recent_reusable(peer, uid, up, down);
	if (r)
		count(totals ? &totals->regions_reused : NULL);
	else if ((r = create(up, down)) != NULL) {
		r->next = list;
		list = r;
		count(totals ? &totals->regions_created : NULL);
	}
	if (r) {
		r->refs = 1;
		r->peer = peer;
		r->owner = sys_getpid();
		r->closed_by_us = 0;
		ring_hdr_init(region_up(r), up);
		ring_hdr_init(region_down(r), down);
		*memfd = r->memfd;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

/*
 * A copy of @memfd among smclo's own descriptors, or -1: where the process
 * cannot spare one (its descriptor budget, or the copy would take one of
 * the application's numbers) a handover is not worth it.
 */
static int keep_hidden(int memfd)
{
	return io_keep_copy(memfd, 1);
}

static struct region *map_new(int memfd, const struct stat *st, uint32_t up, uint32_t down)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	struct region *r;
	int seals = fcntl(memfd, F_GET_SEALS);

	/* a region the client could still shrink could SIGBUS us */
	if (seals < 0 || (seals & need) != need || !(r = calloc(1, sizeof(*r))))
		return NULL;
	r->len = layout_len(up, down);
	r->base = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (r->base == MAP_FAILED) {
		free(r);
		return NULL;
	}
	r->memfd = keep_hidden(memfd);
	r->up = up;
	r->down = down;
	r->dev = st->st_dev;
	r->ino = st->st_ino;
	r->next = list;
	list = r;
	return r;
}

/* Is @memfd (described into @st) a region of exactly these ring sizes? */
static int layout_ok(int memfd, struct stat *st, uint32_t up, uint32_t down)
{
	return ring_size_valid(up) && ring_size_valid(down) && fstat(memfd, st) == 0 &&
	       (size_t)st->st_size == layout_len(up, down);
}

struct region *region_map(int memfd, uint32_t up, uint32_t down, uid_t *owner)
{
	struct region *r;
	struct stat st;

	if (!layout_ok(memfd, &st, up, down))
		return NULL;
	pthread_mutex_lock(&lock);
	for (r = list; r; r = r->next)
		if (!r->mine && r->dev == st.st_dev && r->ino == st.st_ino &&
		    r->up == up && r->down == down && usable(r))
			break;
	if (r)
		count(totals ? &totals->peer_regions_kept : NULL);
	else if ((r = map_new(memfd, &st, up, down)) != NULL)
		count(totals ? &totals->peer_regions_mapped : NULL);
	if (r) {
		r->refs = 1;
		r->owner = sys_getpid();
	}
	pthread_mutex_unlock(&lock);
	/* the client wrote the headers: check them like everything else of its */
	if (r && (ring_hdr_check(region_up(r), up) < 0 || ring_hdr_check(region_down(r), down) < 0)) {
		region_put(r, 0);
		return NULL;
	}
	if (r)
		*owner = st.st_uid;
	return r;
}

void region_drop_memfd(struct region *r)
{
	pthread_mutex_lock(&lock);
	if (r->memfd >= 0)
		sys_close(r->memfd);
	r->memfd = -1;
	if (r->mine)
		r->peer = PEERID_NONE;  /* it cannot be offered again: destroyed when put */
	pthread_mutex_unlock(&lock);
}

int region_memfd(const struct region *r)
{
	return r->memfd;
}

struct region *region_adopt(int memfd, uint32_t up, uint32_t down, int mine)
{
	struct region *r;
	struct stat st;

	if (!layout_ok(memfd, &st, up, down))
		return NULL;
	pthread_mutex_lock(&lock);
	r = map_new(memfd, &st, up, down);
	if (r) {
		r->refs = 1;
		r->owner = sys_getpid();
		/* never offered again: PEERID_NONE (region_put destroys it) */
		r->mine = mine;
		r->creator = st.st_uid;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

void region_note_maker(struct region *r, pid_t pid)
{
	if (!r->mine)
		r->peer = pid > 0 ? peerid_make(PEERID_PID, (uint64_t)pid) : PEERID_NONE;
}

void region_put(struct region *r, int reusable)
{
	pthread_mutex_lock(&lock);
	if (--r->refs > 0) {
		pthread_mutex_unlock(&lock);
		return;
	}
	/*
	 * A peer's region is kept even while the client has not closed its
	 * side yet (a server usually closes first): the client offers it again
	 * only once both sides are done with it, and it is the client's memory
	 * anyway, alive while the client keeps it for reuse.  Not when the
	 * client crashed (the caller says so through @reusable); one that dies
	 * later leaves at most KEEP_THEIRS such mappings behind.
	 */
	if (!reusable || r->owner != sys_getpid() || (r->mine && r->peer == PEERID_NONE)) {
		unlink_entry(r);
		destroy(r);
	} else {
		r->closed_by_us = 1;
		r->idle_since = ++clock_ticks;
		trim();
	}
	pthread_mutex_unlock(&lock);
}
