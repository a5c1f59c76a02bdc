/*
 * peerpool.c - the peer's buffer pool as the receiving side holds it (see
 * peerpool.h).
 *
 * What the peer hands us is checked as everything else it gives us: the
 * memfd must be sealed against shrinking (a pool cut short under our
 * mapping would kill us with SIGBUS on the next read) and be no longer than
 * POOL_MAX_LEN; the other descriptor must be an eventfd (we write to it, and
 * a pipe nobody reads or a socket to somebody else must not get our writes).
 * We map the pool read-only and keep no descriptor of it: the mapping is
 * all a reader needs, and a number of the program's is not spent on it.
 * A second pool on one connection is refused: references name offsets in
 * one pool for the connection's whole life.
 */
#include "peerpool.h"

#include "io.h"
#include "log.h"
#include "sys.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NEEDED_SEALS (F_SEAL_SHRINK | F_SEAL_SEAL)

static int is_eventfd(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return 0;
	link[n] = 0;
	return strcmp(link, "anon_inode:[eventfd]") == 0;
}

/* The pool behind @memfd mapped read-only, or NULL; *@len its size. */
static const uint8_t *map_pool(int memfd, uint64_t *len)
{
	struct stat st;
	int seals = sys_fcntl(memfd, F_GET_SEALS, 0);
	void *p;

	if (seals < 0 || (seals & NEEDED_SEALS) != NEEDED_SEALS)
		return NULL;
	if (fstat(memfd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (uint64_t)st.st_size > POOL_MAX_LEN)
		return NULL;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return NULL;
	*len = (uint64_t)st.st_size;
	return p;
}

void peerpool_adopt(struct conn *c, int memfd, int wakefd)
{
	const uint8_t *base = NULL;
	uint64_t len = 0;

	/* a connection the peer broke stays broken: a reference refused for
	 * want of a pool must not turn valid when one comes after it */
	if (!c->rx_pool && memfd >= 0 && wakefd >= 0 && is_eventfd(wakefd) &&
	    !(atomic_load(&c->sh->flags) & SH_BROKEN))
		base = map_pool(memfd, &len);
	if (memfd >= 0)
		sys_close(memfd);
	if (!base) {
		DBG("refused a pool the peer handed over");
		if (wakefd >= 0)
			sys_close(wakefd);
		return;
	}
	sys_fcntl(wakefd, F_SETFL, O_NONBLOCK);
	c->pool_wake_fd = io_keep_fd(wakefd);
	c->rx_pool_len = len;
	c->rx_pool = base;
	atomic_store_explicit(&c->tx->pool_ack, 1, memory_order_seq_cst);
}

void peerpool_released(struct conn *c)
{
	uint64_t one = 1;

	if (c->pool_wake_fd >= 0 && sys_write(c->pool_wake_fd, &one, sizeof(one)) < 0)
		DBG("pool release wake-up: %m");        /* full counter: it is readable anyway */
}

void peerpool_drop(struct conn *c)
{
	if (c->rx_pool)
		munmap((void *)c->rx_pool, (size_t)c->rx_pool_len);
	if (c->pool_wake_fd >= 0)
		sys_close(c->pool_wake_fd);
	c->rx_pool = NULL;
	c->rx_pool_len = 0;
	c->pool_wake_fd = -1;
}
