/*
 * test_refs.c - the core's pool references, one behaviour each: a stream of
 * ring bytes and referenced pool bytes read whole, in parts, in place and
 * counted (rx.c), a forged reference resetting after the sound bytes before
 * it, and the sending side (tx_send_ref) writing what ring.h says.
 *
 * A connection is built in memory as the core sees one (both rings in one
 * allocation, the doorbell socket a socket pair); the peer's side is
 * written by hand, as a peer would.  tests/fuzz/fuzz_ring.c drives the same
 * code with everything a hostile peer can write.
 */
#include "check.h"

#include "io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define RING (16u << 10)

struct world {
	struct conn c;
	struct conn_shared sh;
	struct ring_hdr *mine, *peer;
	uint8_t pool[4096];
	int fd, other;
};

static struct world *world(void)
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
	w->c.tcp_fd = w->c.bell_fd = w->c.pool_wake_fd = -1;
	w->c.tx = w->mine;
	w->c.rx = w->peer;
	w->c.tx_size = w->c.rx_size = RING;
	w->c.sh = &w->sh;
	memcpy(w->pool, "hello, pool", 11);
	w->c.rx_pool = w->pool;
	w->c.rx_pool_len = sizeof(w->pool);
	return w;
}

static void done(struct world *w)
{
	close(w->fd);
	close(w->other);
	free(w->mine);
	free(w->peer);
	free(w);
}

/* The peer produces @s as ring bytes. */
static void peer_bytes(struct world *w, const char *s)
{
	uint64_t p = atomic_load(&w->peer->prod);

	ring_copy_in(ring_data(w->peer), RING, p, s, strlen(s));
	atomic_store(&w->peer->prod, p + strlen(s));
}

/* The peer sends a reference to @len bytes at @off of its pool. */
static void peer_ref(struct world *w, uint32_t off, uint32_t len)
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

static ssize_t rd(struct world *w, char *buf, size_t n, int flags)
{
	struct iovec v = { buf, n };

	memset(buf, 0, n);
	return rx_recv(&w->c, w->fd, &v, 1, MSG_DONTWAIT | flags);
}

static void test_read_whole(void)
{
	struct world *w = world();
	char buf[64];

	peer_bytes(w, "ab");
	peer_ref(w, 0, 5);
	peer_bytes(w, "cd");
	CHECK(rx_available(&w->c) == 9);
	CHECK(rd(w, buf, sizeof(buf), MSG_PEEK) == 9 && !memcmp(buf, "abhellocd", 9));
	CHECK(w->sh.cons == 0);
	CHECK(rd(w, buf, sizeof(buf), 0) == 9 && !memcmp(buf, "abhellocd", 9));
	/* past the placeholder: the writer sees its buffer released */
	CHECK(w->sh.cons == 5 && w->sh.ref_cons == 1 && w->sh.ref_skip == 0);
	CHECK(atomic_load(&w->mine->cons) == 5);
	CHECK(rd(w, buf, sizeof(buf), 0) < 0 && errno == EAGAIN);
	done(w);
}

static void test_read_in_parts_and_in_place(void)
{
	struct world *w = world();
	struct iovec iov[2];
	char buf[64];
	long n;

	peer_bytes(w, "ab");
	peer_ref(w, 0, 5);
	peer_bytes(w, "cd");
	CHECK(rd(w, buf, 3, 0) == 3 && !memcmp(buf, "abh", 3));
	/* inside the reference: the cursor stays at its placeholder */
	CHECK(w->sh.cons == 2 && w->sh.ref_skip == 1);
	CHECK(atomic_load(&w->mine->cons) != 3);
	/* a peek shows the rest of the buffer in place, and only that run */
	n = rx_peek(&w->c, w->fd, 1, iov, 1);
	CHECK(n == 4 && iov[0].iov_base == (void *)(w->pool + 1) && iov[1].iov_len == 0);
	rx_consume(&w->c, w->fd, 2);
	CHECK(w->sh.ref_skip == 3);
	/* a peek asking for more than the run still gets the run: its edge */
	n = rx_peek(&w->c, w->fd, 100, iov, 1);
	CHECK(n == 2 && !memcmp(iov[0].iov_base, "lo", 2));
	rx_consume(&w->c, w->fd, 2);
	CHECK(w->sh.cons == 3 && w->sh.ref_cons == 1 && w->sh.ref_skip == 0);
	CHECK(rd(w, buf, sizeof(buf), 0) == 2 && !memcmp(buf, "cd", 2));
	done(w);
}

static void test_two_references_in_a_row(void)
{
	struct world *w = world();
	char buf[64];

	peer_ref(w, 7, 4);      /* "pool" */
	peer_ref(w, 0, 5);      /* "hello" */
	CHECK(rx_available(&w->c) == 9);
	CHECK(rd(w, buf, sizeof(buf), 0) == 9 && !memcmp(buf, "poolhello", 9));
	CHECK(w->sh.cons == 2 && w->sh.ref_cons == 2);
	done(w);
}

static void test_forged_reference_resets_after_sound_bytes(void)
{
	struct world *w = world();
	char buf[64];

	peer_bytes(w, "ab");
	peer_ref(w, sizeof(w->pool) - 2, 5);    /* 3 bytes past the pool's end */
	CHECK(rx_available(&w->c) == 2);
	CHECK(rd(w, buf, sizeof(buf), 0) == 2 && !memcmp(buf, "ab", 2));
	CHECK(rd(w, buf, sizeof(buf), 0) < 0 && errno == ECONNRESET);
	CHECK(atomic_load(&w->sh.flags) & SH_BROKEN);
	done(w);
}

static void test_reference_without_pool_or_behind_resets(void)
{
	struct world *w = world();
	char buf[64];
	struct ring_ref *e;

	w->c.rx_pool = NULL;    /* never handed over */
	peer_ref(w, 0, 5);
	CHECK(rd(w, buf, sizeof(buf), 0) < 0 && errno == ECONNRESET);
	done(w);

	w = world();
	peer_bytes(w, "abcd");
	CHECK(rd(w, buf, 2, 0) == 2);
	peer_ref(w, 0, 5);
	e = &w->peer->ref[0];
	atomic_store(&e->pos, 1);               /* behind our cursor */
	CHECK(rd(w, buf, sizeof(buf), 0) < 0 && errno == ECONNRESET);
	done(w);
}

static void test_send_ref(void)
{
	struct world *w = world();
	long long end;

	end = tx_send_ref(&w->c, w->fd, 4096, 1000, 1);
	CHECK(end == 1);
	CHECK(atomic_load(&w->mine->ref_prod) == 1 && atomic_load(&w->mine->prod) == 1);
	CHECK(atomic_load(&w->mine->ref[0].pos) == 0 && atomic_load(&w->mine->ref[0].off) == 4096 &&
	      atomic_load(&w->mine->ref[0].len) == 1000);
	CHECK(w->sh.ref_end == 1);
	end = tx_send_ref(&w->c, w->fd, 0, 10, 1);
	CHECK(end == 2 && atomic_load(&w->mine->ref[1].pos) == 1);
	done(w);
}

int main(void)
{
	test_read_whole();
	test_read_in_parts_and_in_place();
	test_two_references_in_a_row();
	test_forged_reference_resets_after_sound_bytes();
	test_reference_without_pool_or_behind_resets();
	test_send_ref();
	return check_report("test_refs");
}
