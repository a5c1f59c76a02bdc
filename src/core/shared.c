/*
 * shared.c - the memory of struct conn_shared: cursors, locks and the
 * holders count that every process holding a connection must agree on.
 *
 * Every holder maps the same bytes: a fork child by inheriting the mapping,
 * a program exec'd with the connection (handover.c) by mapping the page
 * again from a descriptor.  So the state lives in memfd "chunks" of
 * CHUNK_SLOTS slots, one descriptor per chunk (not per connection: a
 * server with RLIMIT_NOFILE 64 still serves 50 connections), carved the way
 * page_frag carves pages (docs/background.md section 2).
 *
 * A slot is taken again only by the process that made its chunk, and only
 * once every holder in every process is gone (holders reached 0).  When the
 * last holder was elsewhere, the slot was left ABANDONED here and is found
 * again by a scan once the free list runs dry.
 */
#include "conn.h"

#include "io.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define SLOT_SIZE    256u
#define CHUNK_SLOTS  256u
#define CHUNK_LEN    ((size_t)SLOT_SIZE * CHUNK_SLOTS)
#define PAGE         4096u

_Static_assert(sizeof(struct conn_shared) <= SLOT_SIZE, "conn_shared outgrew its slot");
_Static_assert(PAGE % SLOT_SIZE == 0, "a slot must not straddle pages");

#define SLOT_FREE       0u
#define SLOT_USED       1u
#define SLOT_ABANDONED  2u      /* its maker let go while others still held it */

struct chunk {
	struct chunk *next;
	uint8_t *base;          /* maps [file_off, file_off + len) of the memfd */
	size_t len;
	uint32_t file_off;
	int fd;                 /* hidden, close-on-exec (cleared for a handover) */
	pid_t maker;            /* only this process takes its slots; 0: the page
	                           of one slot taken over from an exec'd predecessor */
	uint32_t used;          /* slots ever handed out (the rest never touched) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct chunk *chunks;            /* ours and those inherited through fork */
static struct conn_shared *free_slots;  /* ours, linked through tx_lock's bytes */

/* Held across fork() (runtime/fork.c): the child's copy is then free. */
void shared_fork_lock(void)
{
	pthread_mutex_lock(&lock);
}

void shared_fork_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

void shared_lock(pthread_mutex_t *m)
{
	/* a holder killed mid-operation leaves cursors consistent: they are
	 * only ever advanced after the bytes they cover were copied */
	if (pthread_mutex_lock(m) == EOWNERDEAD)
		pthread_mutex_consistent(m);
}

void shared_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
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

static struct chunk *chunk_of(const struct conn_shared *sh)
{
	for (struct chunk *k = chunks; k; k = k->next)
		if ((const uint8_t *)sh >= k->base && (const uint8_t *)sh < k->base + k->len)
			return k;
	return NULL;
}

static struct chunk *chunk_new(void)
{
	struct chunk *k = calloc(1, sizeof(*k));
	int fd = memfd_create("smclo-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	/* sealed at its size: a mapping of it, here or after an exec, never SIGBUSes */
	if (!k || fd < 0 || ftruncate(fd, CHUNK_LEN) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		goto fail;
	k->base = mmap(NULL, CHUNK_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (k->base == MAP_FAILED)
		goto fail;
	k->fd = io_keep_fd(fd);
	k->len = CHUNK_LEN;
	k->maker = sys_getpid();
	k->next = chunks;
	chunks = k;
	return k;
fail:
	if (fd >= 0)
		sys_close(fd);
	free(k);
	return NULL;
}

/* An abandoned slot of ours whose last holder has gone since (lock held). */
static struct conn_shared *reclaim(pid_t me)
{
	for (struct chunk *k = chunks; k; k = k->next) {
		if (k->maker != me)
			continue;
		for (uint32_t i = 0; i < k->used; i++) {
			struct conn_shared *sh = (struct conn_shared *)(k->base + i * SLOT_SIZE);
			if (atomic_load(&sh->slot_state) == SLOT_ABANDONED &&
			    atomic_load(&sh->holders) <= 0)
				return sh;
		}
	}
	return NULL;
}

static struct conn_shared *slot_take(void)
{
	pid_t me = sys_getpid();
	struct conn_shared *sh = NULL;
	struct chunk *k;

	pthread_mutex_lock(&lock);
	k = free_slots ? chunk_of(free_slots) : NULL;
	if (k && k->maker == me) {
		sh = free_slots;
		memcpy(&free_slots, &sh->tx_lock, sizeof(free_slots));
	} else {
		free_slots = NULL;      /* the parent's list, copied by fork: not ours */
	}
	if (!sh)
		sh = reclaim(me);
	for (k = chunks; !sh && k; k = k->next)
		if (k->maker == me && k->used < CHUNK_SLOTS)
			sh = (struct conn_shared *)(k->base + k->used++ * SLOT_SIZE);
	if (!sh && (k = chunk_new()) != NULL)
		sh = (struct conn_shared *)(k->base + k->used++ * SLOT_SIZE);
	pthread_mutex_unlock(&lock);
	return sh;
}

struct conn_shared *shared_new(void)
{
	struct conn_shared *sh = slot_take();

	if (!sh)
		return NULL;
	memset(sh, 0, sizeof(*sh));
	robust_init(&sh->tx_lock);
	robust_init(&sh->rx_lock);
	sh->holders = 1;
	sh->slot_state = SLOT_USED;
	return sh;
}

static void unlink_chunk(struct chunk *k)
{
	for (struct chunk **pp = &chunks; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			return;
		}
}

void shared_put(struct conn_shared *sh, int reusable)
{
	struct chunk *k, *adopted = NULL;

	pthread_mutex_lock(&lock);
	k = chunk_of(sh);
	if (k && k->maker == 0) {
		unlink_chunk(k);        /* one slot's page, taken over at exec */
		adopted = k;
	} else if (k && k->maker == sys_getpid()) {
		if (reusable) {
			atomic_store(&sh->slot_state, SLOT_FREE);
			memcpy(&sh->tx_lock, &free_slots, sizeof(free_slots));
			free_slots = sh;
		} else {
			atomic_store(&sh->slot_state, SLOT_ABANDONED);
		}
	}
	/* a slot of our parent's chunk is the parent's to take again */
	pthread_mutex_unlock(&lock);
	if (adopted) {
		munmap(adopted->base, adopted->len);
		sys_close(adopted->fd);
		free(adopted);
	}
}

int shared_locate(const struct conn_shared *sh, int *fd, uint32_t *offset)
{
	struct chunk *k;

	pthread_mutex_lock(&lock);
	k = chunk_of(sh);
	if (k) {
		*fd = k->fd;
		*offset = k->file_off + (uint32_t)((const uint8_t *)sh - k->base);
	}
	pthread_mutex_unlock(&lock);
	return k ? 0 : -1;
}

struct conn_shared *shared_adopt(int fd, uint32_t offset)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW;
	uint32_t page = offset & ~(PAGE - 1);
	struct chunk *k;
	struct stat st;

	int seals = fcntl(fd, F_GET_SEALS);

	/* a memfd sealed at its size: nothing else can be mapped here */
	if (offset % SLOT_SIZE || offset >= CHUNK_LEN || fstat(fd, &st) < 0 ||
	    st.st_size != (off_t)CHUNK_LEN || seals < 0 || (seals & need) != need ||
	    !(k = calloc(1, sizeof(*k))))
		return NULL;
	k->base = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, page);
	/* kept, to hand the connection on again at the next exec */
	k->fd = k->base == MAP_FAILED ? -1 : io_keep_copy(fd, 0);
	if (k->fd < 0) {
		if (k->base != MAP_FAILED)
			munmap(k->base, PAGE);
		free(k);
		return NULL;
	}
	k->len = PAGE;
	k->file_off = page;
	pthread_mutex_lock(&lock);
	k->next = chunks;
	chunks = k;
	pthread_mutex_unlock(&lock);
	return (struct conn_shared *)(k->base + (offset - page));
}
