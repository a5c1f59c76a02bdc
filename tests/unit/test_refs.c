/*
 * test_refs.c - the core's pool references, one behaviour each: a stream of
 * ring bytes and referenced pool bytes read whole, in parts, in place and
 * counted (rx.c), a forged reference resetting after the sound bytes before
 * it, and the sending side (tx_send_ref) writing what ring.h says.
 *
 * A connection is built in memory as the core sees one (world.h); the
 * peer's side is written by hand, as a peer would.  tests/fuzz/fuzz_ring.c drives the same
 * code with everything a hostile peer can write.
 */
#include "check.h"

#include "io.h"
#include "world.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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
	CHECK(rd(w, buf, sizeof(buf), 0) == -EAGAIN);
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
	CHECK(rd(w, buf, sizeof(buf), 0) == -ECONNRESET);
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
	CHECK(rd(w, buf, sizeof(buf), 0) == -ECONNRESET);
	done(w);

	w = world();
	peer_bytes(w, "abcd");
	CHECK(rd(w, buf, 2, 0) == 2);
	peer_ref(w, 0, 5);
	e = &w->peer->ref[0];
	atomic_store(&e->pos, 1);               /* behind our cursor */
	CHECK(rd(w, buf, sizeof(buf), 0) == -ECONNRESET);
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
