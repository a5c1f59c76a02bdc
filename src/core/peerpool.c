/*
 * peerpool.c - the peer's buffer pool as the receiving side holds it (see
 * peerpool.h).
 *
 * What the peer hands us is checked as everything else it gives us: the
 * memfd must be a tmpfs file (not hugetlbfs, whose holes fault with
 * SIGBUS once its pages run out) sealed against shrinking and against
 * writes through new mappings, which also forbids punching holes - a pool
 * cut short or hollowed under our mapping would kill us with SIGBUS on the
 * next read - and be no longer than POOL_MAX_LEN; the other descriptor
 * must be an AF_UNIX SEQPACKET socket, on which we send with MSG_DONTWAIT:
 * the peer shares the open file of anything it hands us, O_NONBLOCK
 * included, so a descriptor whose reads or writes honour that flag (an
 * eventfd, a pipe) could be made to block us for ever.
 * We map the pool read-only and keep its descriptor hidden (fdtab.c): a
 * program we exec, or pass the connection to, maps it again
 * (peerpool_inherit) and reads on where we stopped.
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
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define NEEDED_SEALS (F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

static int is_wake_socket(int fd)
{
	int domain = 0, type = 0;
	socklen_t l = sizeof(int);

	if (sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l) < 0)
		return 0;
	l = sizeof(int);
	return sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) == 0 &&
	       domain == AF_UNIX && type == SOCK_SEQPACKET;
}

/* The pool behind @memfd mapped read-only, or NULL; *@len its size. */
static const uint8_t *map_pool(int memfd, uint64_t *len)
{
	struct statfs fs;
	struct stat st;
	int seals = sys_fcntl(memfd, F_GET_SEALS, 0);
	void *p;

	if (seals < 0 || (seals & NEEDED_SEALS) != NEEDED_SEALS)
		return NULL;
	if (fstatfs(memfd, &fs) < 0 || fs.f_type != TMPFS_MAGIC)
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
	 * want of a pool must not turn valid when one comes after it.  And
	 * only a connection this process alone holds: the mapping is this
	 * process's (and its later fork children's), but the acknowledgement
	 * would make the peer send references a fork sibling that holds the
	 * connection too could not read */
	if (!c->rx_pool && memfd >= 0 && wakefd >= 0 && is_wake_socket(wakefd) &&
	    !(atomic_load(&c->sh->flags) & SH_BROKEN) && atomic_load(&c->sh->holders) == 1)
		base = map_pool(memfd, &len);
	if (!base) {
		DBG("refused a pool the peer handed over");
		if (memfd >= 0)
			sys_close(memfd);
		if (wakefd >= 0)
			sys_close(wakefd);
		return;
	}
	c->rx_pool_fd = io_keep_fd(memfd);
	c->pool_wake_fd = io_keep_fd(wakefd);
	c->rx_pool_len = len;
	c->rx_pool = base;
	atomic_store_explicit(&c->tx->pool_ack, 1, memory_order_seq_cst);
}

int peerpool_inherit(struct conn *c, int memfd, int wakefd)
{
	const uint8_t *base;
	uint64_t len = 0;
	int keep_mem, keep_wake;

	/* checked again: the environment and the parcel are not the peer's,
	 * but not above suspicion either */
	if (c->rx_pool || !is_wake_socket(wakefd) || !(base = map_pool(memfd, &len)))
		return -1;
	keep_mem = io_keep_copy(memfd, 0);
	keep_wake = io_keep_copy(wakefd, 0);
	if (keep_mem < 0 || keep_wake < 0) {
		munmap((void *)base, (size_t)len);
		if (keep_mem >= 0)
			sys_close(keep_mem);
		if (keep_wake >= 0)
			sys_close(keep_wake);
		return -1;
	}
	c->rx_pool_fd = keep_mem;
	c->pool_wake_fd = keep_wake;
	c->rx_pool_len = len;
	c->rx_pool = base;
	return 0;
}

void peerpool_released(struct conn *c)
{
	/* only when the sender asked since it last looked (pool_wake_wanted,
	 * taken after our cursor was published: seq_cst against its
	 * ask-then-look); a full queue: it has wake-ups to read anyway */
	if (c->pool_wake_fd >= 0 &&
	    /* the region is mapped writable by both; the word is the sender's */
	    atomic_exchange_explicit((_Atomic uint32_t *)&c->rx->pool_wake_wanted, 0,
	                             memory_order_seq_cst) &&
	    sys_send(c->pool_wake_fd, "r", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		DBG("pool release wake-up: %m");
}

void peerpool_drop(struct conn *c)
{
	if (c->rx_pool)
		munmap((void *)c->rx_pool, (size_t)c->rx_pool_len);
	if (c->rx_pool_fd >= 0)
		sys_close(c->rx_pool_fd);
	if (c->pool_wake_fd >= 0)
		sys_close(c->pool_wake_fd);
	c->rx_pool = NULL;
	c->rx_pool_len = 0;
	c->rx_pool_fd = c->pool_wake_fd = -1;
}
