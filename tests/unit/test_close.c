/*
 * test_close.c - how a connection ends on its rings (close.c, and what rx.c
 * and tx.c make of it), one behaviour each: shutdown(SHUT_WR) marks our
 * stream's end after our last byte and refuses further sends;
 * shutdown(SHUT_RD) ends our reads; a bad @how is EINVAL; the last holder's
 * close says CLOSED - plus ABORT when the peer's bytes go unread, or when
 * asked - after our last byte; the peer's CLOSED reads as every byte and
 * then end of file, its ABORT as every byte and then ECONNRESET, and a send
 * after it fails with EPIPE.
 */
#include "check.h"

#include "world.h"

#include <errno.h>
#include <poll.h>

static ssize_t rd(struct world *w, char *buf, size_t n)
{
	struct iovec v = { buf, n };

	return rx_recv(&w->c, w->fd, &v, 1, MSG_DONTWAIT);
}

static ssize_t wr(struct world *w, const char *s)
{
	struct iovec v = { (void *)s, strlen(s) };

	return tx_send(&w->c, w->fd, &v, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void test_shutdown_write(void)
{
	struct world *w = world();
	struct pollfd p = { .fd = w->other, .events = POLLIN | POLLRDHUP };

	CHECK(wr(w, "abc") == 3);
	/* its doorbell only */
	CHECK(poll(&p, 1, 0) == 1 && p.revents == POLLIN);
	CHECK(close_shutdown(&w->c, w->fd, SHUT_WR) == 0);
	CHECK(atomic_load(&w->mine->flags) & RING_F_SHUTDOWN);
	CHECK(atomic_load(&w->mine->fin_prod) == 3);
	CHECK(wr(w, "d") == -EPIPE);
	/* the peer's descriptor hears it too (POLLRDHUP / EPOLLRDHUP) */
	CHECK(poll(&p, 1, 0) == 1 && (p.revents & POLLRDHUP));
	done(w);
}

static void test_shutdown_read_and_bad_how(void)
{
	struct world *w = world_without_pool();
	char buf[8];

	peer_bytes(w, "xy");
	CHECK(close_shutdown(&w->c, w->fd, SHUT_RD) == 0);
	/* as Linux: what is there is still read, then the end */
	CHECK(rd(w, buf, sizeof(buf)) == 2 && !memcmp(buf, "xy", 2));
	CHECK(rd(w, buf, sizeof(buf)) == 0);
	CHECK(close_shutdown(&w->c, w->fd, 42) == -EINVAL);
	done(w);
}

static void test_close_says_how(void)
{
	struct world *w = world_without_pool();
	char buf[8];

	/* everything the peer sent was read: a plain close */
	peer_bytes(w, "ab");
	CHECK(rd(w, buf, sizeof(buf)) == 2);
	CHECK(wr(w, "last") == 4);
	close_publish(&w->c, 0);
	CHECK(atomic_load(&w->mine->flags) == RING_F_CLOSED);
	CHECK(atomic_load(&w->mine->fin_prod) == 4);
	done(w);

	/* bytes of the peer's thrown away: the peer hears a reset */
	w = world_without_pool();
	peer_bytes(w, "unread");
	close_publish(&w->c, 0);
	CHECK(atomic_load(&w->mine->flags) == (RING_F_CLOSED | RING_F_ABORT));
	done(w);

	/* asked for (SO_LINGER 0) */
	w = world_without_pool();
	close_publish(&w->c, 1);
	CHECK(atomic_load(&w->mine->flags) == (RING_F_CLOSED | RING_F_ABORT));
	done(w);
}

/* The peer ends its stream after "bye" with @flags. */
static void peer_ends(struct world *w, uint32_t flags)
{
	peer_bytes(w, "bye");
	atomic_store(&w->peer->fin_prod, atomic_load(&w->peer->prod));
	atomic_fetch_or(&w->peer->flags, flags);
}

static void test_peer_close_reads_to_the_end(void)
{
	struct world *w = world_without_pool();
	char buf[8];

	peer_ends(w, RING_F_CLOSED);
	CHECK(rd(w, buf, sizeof(buf)) == 3 && !memcmp(buf, "bye", 3));
	CHECK(rd(w, buf, sizeof(buf)) == 0);
	/* as TCP: the first write to a closed peer is taken (its reset
	 * follows), the next fails (core/tcpend.c) */
	CHECK(wr(w, "late") == 4);
	CHECK(wr(w, "later") == -EPIPE);
	CHECK(rd(w, buf, sizeof(buf)) == 0);
	done(w);

	w = world_without_pool();
	peer_ends(w, RING_F_CLOSED | RING_F_ABORT);
	CHECK(rd(w, buf, sizeof(buf)) == 3 && !memcmp(buf, "bye", 3));
	/* a reset's error once, then the end */
	CHECK(rd(w, buf, sizeof(buf)) == -ECONNRESET);
	CHECK(rd(w, buf, sizeof(buf)) == 0);
	CHECK(wr(w, "late") == -EPIPE);
	done(w);

	w = world_without_pool();
	peer_ends(w, RING_F_SHUTDOWN);
	CHECK(rd(w, buf, sizeof(buf)) == 3 && rd(w, buf, sizeof(buf)) == 0);
	CHECK(wr(w, "still") == 5);     /* half-closed: we may still send */
	done(w);
}

int main(void)
{
	test_shutdown_write();
	test_shutdown_read_and_bad_how();
	test_close_says_how();
	test_peer_close_reads_to_the_end();
	return check_report("test_close");
}
