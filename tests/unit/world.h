/*
 * world.h - a connection built in memory as the core sees one, for the unit
 * tests of core modules: both rings, the shared state, a socket pair as the
 * doorbell socket (@fd ours, @other the peer's end), and a small pool of
 * the peer's already mapped (test_refs) or not (world_without_pool).  The
 * peer's side is written by hand, as a peer would write it.
 */
#ifndef SMCLO_TEST_WORLD_H
#define SMCLO_TEST_WORLD_H

#include "io.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RING (16u << 10)

struct world {
	struct conn c;
	struct conn_shared sh;
	struct ring_hdr *mine, *peer;
	uint8_t pool[4096];
	int fd, other;
};

static inline struct world *world(void)
{
	struct world *w = calloc(1, sizeof(*w));
	int sp[2];

	w->mine = aligned_alloc(64, ring_region_len(RING));
	w->peer = aligned_alloc(64, ring_region_len(RING));
	ring_hdr_init(w->mine, RING);
	ring_hdr_init(w->peer, RING);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, sp) < 0)
		abort();
	w->fd = sp[0];
	w->other = sp[1];
	pthread_mutex_init(&w->sh.tx_lock, NULL);
	pthread_mutex_init(&w->sh.rx_lock, NULL);
	atomic_store(&w->sh.holders, 1);
	atomic_store(&w->sh.nonblock, 1);
	w->c.refs = 1;
	w->c.mode = MODE_SHM;
	w->c.tcp_fd = w->c.bell_fd = w->c.rx_pool_fd = w->c.pool_wake_fd = -1;
	w->c.tx = w->mine;
	w->c.rx = w->peer;
	w->c.tx_size = w->c.rx_size = RING;
	w->c.sh = &w->sh;
	memcpy(w->pool, "hello, pool", 11);
	w->c.rx_pool = w->pool;
	w->c.rx_pool_len = sizeof(w->pool);
	return w;
}

static inline void done(struct world *w)
{
	close(w->fd);
	close(w->other);
	free(w->mine);
	free(w->peer);
	free(w);
}

/* The peer produces @s as ring bytes. */
static inline void peer_bytes(struct world *w, const char *s)
{
	uint64_t p = atomic_load(&w->peer->prod);

	ring_copy_in(ring_data(w->peer), RING, p, s, strlen(s));
	atomic_store(&w->peer->prod, p + strlen(s));
}

/* The peer sends a reference to @len bytes at @off of its pool. */
static inline void peer_ref(struct world *w, uint32_t off, uint32_t len)
{
	uint64_t p = atomic_load(&w->peer->prod), n = atomic_load(&w->peer->ref_prod);
	struct ring_ref *e = &w->peer->ref[n % RING_REFS];

	atomic_store(&e->pos, p);
	atomic_store(&e->off, off);
	atomic_store(&e->len, len);
	atomic_store(&w->peer->ref_prod, n + 1);
	ring_data(w->peer)[p % RING] = 0xee;    /* the placeholder: never read */
	atomic_store(&w->peer->prod, p + 1);
}

/* The same, with no pool of the peer's mapped. */
static inline struct world *world_without_pool(void)
{
	struct world *w = world();

	w->c.rx_pool = NULL;
	w->c.rx_pool_len = 0;
	return w;
}

#endif
