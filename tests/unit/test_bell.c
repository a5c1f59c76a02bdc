/*
 * test_bell.c - the reader's side of doorbells (bell.c, and when rx.c
 * drains them), one behaviour each: doorbells that cover nothing unread
 * are drained once the ring is empty, a live one stays while its bytes are
 * unread, "keep one" drains all but the last, a doorbell that carries the
 * peer's pool is taken at the first read after it once another doorbell
 * follows it (not only when the ring runs empty), and bytes where only
 * doorbells belong break the connection.
 */
#include "check.h"

#include "peerpool.h"
#include "world.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>

/* The peer rings: its doorbell log says its producer cursor, then the
 * doorbell itself, carrying @fds (@n of them) if any. */
static void peer_rings(struct world *w, const int *fds, int n)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(2 * sizeof(int))];
	} u;
	struct msghdr m = { 0 };
	uint64_t seq = atomic_load(&w->peer->bell_seq);

	atomic_store(&w->peer->bell_val[seq % BELL_LOG], atomic_load(&w->peer->prod));
	atomic_store(&w->peer->bell_seq, seq + 1);
	if (n) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)n * sizeof(int));
	}
	if (sendmsg(w->other, &m, MSG_DONTWAIT) < 0)
		abort();
}

static ssize_t rd(struct world *w, char *buf, size_t n)
{
	struct iovec v = { buf, n };

	return rx_recv(&w->c, w->fd, &v, 1, MSG_DONTWAIT);
}

static void test_stale_doorbells_drained_when_empty(void)
{
	struct world *w = world_without_pool();
	char buf[16];

	peer_bytes(w, "ab");
	peer_rings(w, NULL, 0);
	peer_bytes(w, "cd");
	peer_rings(w, NULL, 0);
	CHECK(rd(w, buf, sizeof(buf)) == 4);
	CHECK(w->sh.bells_drained == 2 && atomic_load(&w->mine->bells_drained) == 2);
	done(w);
}

static void test_live_doorbell_stays(void)
{
	struct world *w = world_without_pool();
	char buf[16];

	peer_bytes(w, "abcd");
	peer_rings(w, NULL, 0);
	CHECK(rd(w, buf, 2) == 2);
	/* its bytes are still unread: it keeps the descriptor readable */
	bell_drain(&w->c, w->fd, 0);
	CHECK(w->sh.bells_drained == 0);
	done(w);
}

static void test_keep_one(void)
{
	struct world *w = world_without_pool();

	for (int i = 0; i < 3; i++) {
		peer_bytes(w, "x");
		peer_rings(w, NULL, 0);
	}
	bell_drain(&w->c, w->fd, 1);
	CHECK(w->sh.bells_drained == 2);
	done(w);
}

static void test_pool_taken_before_the_ring_empties(void)
{
	struct world *w = world_without_pool();
	int sv[2], mem = memfd_create("pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	char buf[16];

	if (mem < 0 || ftruncate(mem, 4096) < 0 ||
	    fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	/* the pool on doorbell 1 (as bell_send_pool says), bytes and doorbell 2 after it */
	peer_rings(w, (int[]){ mem, sv[1] }, 2);
	atomic_store(&w->peer->pool_bell, 1);
	peer_bytes(w, "abcdef");
	peer_rings(w, NULL, 0);
	close(mem);
	close(sv[1]);
	/* a read that leaves bytes unread takes it, and keeps the last doorbell */
	CHECK(rd(w, buf, 2) == 2);
	CHECK(w->c.rx_pool != NULL && atomic_load(&w->mine->pool_ack) == 1);
	CHECK(w->sh.bells_drained == 1);
	CHECK(rd(w, buf, sizeof(buf)) == 4);
	peerpool_drop(&w->c);
	close(sv[0]);
	done(w);
}

static void test_bytes_on_the_doorbell_socket_break(void)
{
	struct world *w = world_without_pool();
	char buf[16];

	peer_bytes(w, "ab");
	atomic_store(&w->peer->bell_val[0], 2);
	atomic_store(&w->peer->bell_seq, 1);
	if (send(w->other, "junk", 4, MSG_DONTWAIT) != 4)
		abort();
	CHECK(rd(w, buf, sizeof(buf)) == 2);
	CHECK(atomic_load(&w->sh.flags) & SH_BROKEN);
	CHECK(rd(w, buf, sizeof(buf)) == -ECONNRESET);
	done(w);
}

int main(void)
{
	test_stale_doorbells_drained_when_empty();
	test_live_doorbell_stays();
	test_keep_one();
	test_pool_taken_before_the_ring_empties();
	test_bytes_on_the_doorbell_socket_break();
	return check_report("test_bell");
}
