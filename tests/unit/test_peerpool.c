/*
 * test_peerpool.c - the peer's pool as the receiving side takes it
 * (peerpool.c), one behaviour each: a sound pool is mapped and acknowledged;
 * one that could shrink, be written through a new mapping (and so be
 * hollowed out), live on hugetlbfs, or exceed 1 GiB is refused, as is a
 * wake-up descriptor that is not an AF_UNIX SEQPACKET socket, a second pool,
 * a pool on a broken connection, and a pool while a fork sibling holds the
 * connection too; a release wakes the sender once it asked, once, and never
 * waits, even when the sender left no room on a blocking socket; and a pool handed on (exec, SCM_RIGHTS) is mapped
 * again by peerpool_inherit, checked the same way.
 */
#include "check.h"

#include "peerpool.h"
#include "world.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#define POOL_LEN 8192
#define ALL_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

/* A memfd of @len bytes starting "pool", with @seals (and @flags to make it). */
static int pool_memfd(size_t len, int seals, unsigned flags)
{
	int fd = memfd_create("test-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)len) < 0 || (!(flags & MFD_HUGETLB) && pwrite(fd, "pool", 4, 0) != 4) ||
	    (seals && fcntl(fd, F_ADD_SEALS, seals) < 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A SEQPACKET pair: *@keep stays with the "sender", the other end returned. */
static int wake_pair(int *keep)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	*keep = sv[0];
	return sv[1];
}

/* Is @fd no longer open? (adopt closes what it refuses) */
static int closed(int fd)
{
	return fcntl(fd, F_GETFD) < 0 && errno == EBADF;
}

static void test_sound_pool_taken(void)
{
	struct world *w = world_without_pool();
	int keep, wake = wake_pair(&keep), mem = pool_memfd(POOL_LEN, ALL_SEALS, 0);
	char b;

	peerpool_adopt(&w->c, mem, wake);
	CHECK(w->c.rx_pool && w->c.rx_pool_len == POOL_LEN && !memcmp(w->c.rx_pool, "pool", 4));
	CHECK(atomic_load(&w->mine->pool_ack) == 1);
	CHECK(w->c.rx_pool_fd >= 0 && w->c.pool_wake_fd >= 0);
	/* a release says so on the socket - once the sender asked */
	peerpool_released(&w->c);
	CHECK(recv(keep, &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
	atomic_store(&w->peer->pool_wake_wanted, 1);
	peerpool_released(&w->c);
	peerpool_released(&w->c);
	CHECK(recv(keep, &b, 1, MSG_DONTWAIT) == 1 && atomic_load(&w->peer->pool_wake_wanted) == 0);
	CHECK(recv(keep, &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);      /* one, not two */
	peerpool_drop(&w->c);
	CHECK(!w->c.rx_pool && w->c.rx_pool_fd == -1 && w->c.pool_wake_fd == -1);
	close(keep);
	done(w);
}

/* Hand over @mem and @wake; the pool must be refused and both closed. */
static void refused(struct world *w, int mem, int wake, const char *what)
{
	peerpool_adopt(&w->c, mem, wake);
	if (w->c.rx_pool || atomic_load(&w->mine->pool_ack))
		fprintf(stderr, "taken: %s\n", what);
	CHECK(!w->c.rx_pool && atomic_load(&w->mine->pool_ack) == 0);
	CHECK(mem < 0 || closed(mem));
	CHECK(wake < 0 || closed(wake));
}

static void test_unsound_pools_refused(void)
{
	struct world *w = world_without_pool();
	int keep, huge;

	refused(w, pool_memfd(POOL_LEN, 0, 0), wake_pair(&keep), "unsealed");
	close(keep);
	refused(w, pool_memfd(POOL_LEN, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, 0),
	        wake_pair(&keep), "writable through a new mapping");
	close(keep);
	refused(w, pool_memfd((1ull << 30) + 4096, ALL_SEALS, 0), wake_pair(&keep), "over 1 GiB");
	close(keep);
	refused(w, pool_memfd(POOL_LEN, ALL_SEALS, 0), eventfd(0, EFD_CLOEXEC), "an eventfd");
	refused(w, pool_memfd(POOL_LEN, ALL_SEALS, 0), -1, "no wake-up descriptor");
	refused(w, -1, wake_pair(&keep), "no memfd");
	close(keep);
	/* hugetlbfs: where the kernel has it (its holes fault with SIGBUS) */
	huge = pool_memfd(2u << 20, ALL_SEALS, MFD_HUGETLB);
	if (huge >= 0) {
		refused(w, huge, wake_pair(&keep), "hugetlbfs");
		close(keep);
	} else {
		printf("test_peerpool: no hugetlbfs memfd here (%s): not tried\n", strerror(errno));
	}
	done(w);
}

static void test_no_pool_on_shared_or_broken_connection(void)
{
	struct world *w = world_without_pool();
	int keep;

	/* a fork sibling holds it too: it could not read our references */
	atomic_store(&w->sh.holders, 2);
	refused(w, pool_memfd(POOL_LEN, ALL_SEALS, 0), wake_pair(&keep), "two holders");
	close(keep);
	atomic_store(&w->sh.holders, 1);
	atomic_fetch_or(&w->sh.flags, SH_BROKEN);
	refused(w, pool_memfd(POOL_LEN, ALL_SEALS, 0), wake_pair(&keep), "broken connection");
	close(keep);
	done(w);
}

static void test_second_pool_refused(void)
{
	struct world *w = world_without_pool();
	int keep1, keep2, mem2 = pool_memfd(POOL_LEN, ALL_SEALS, 0);
	int wake2 = wake_pair(&keep2);

	peerpool_adopt(&w->c, pool_memfd(POOL_LEN, ALL_SEALS, 0), wake_pair(&keep1));
	CHECK(w->c.rx_pool != NULL);
	const uint8_t *first = w->c.rx_pool;
	peerpool_adopt(&w->c, mem2, wake2);
	CHECK(w->c.rx_pool == first && closed(mem2) && closed(wake2));
	peerpool_drop(&w->c);
	close(keep1);
	close(keep2);
	done(w);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "test_peerpool: a release waited\n";
	if (write(2, m, sizeof(m) - 1) < 0)
		_exit(2);
	_exit(1);
}

static void test_release_never_waits(void)
{
	struct world *w = world_without_pool();
	int keep, wake = wake_pair(&keep);

	/* the sender leaves no room on its (blocking) socket */
	while (send(wake, "x", 1, MSG_DONTWAIT) == 1)
		;
	peerpool_adopt(&w->c, pool_memfd(POOL_LEN, ALL_SEALS, 0), wake);
	CHECK(w->c.rx_pool != NULL);
	signal(SIGALRM, on_alarm);
	alarm(5);
	for (int i = 0; i < 100; i++) {
		atomic_store(&w->peer->pool_wake_wanted, 1);
		peerpool_released(&w->c);
	}
	alarm(0);
	CHECK(1);       /* came back */
	peerpool_drop(&w->c);
	close(keep);
	done(w);
}

static void test_inherit(void)
{
	struct world *from = world_without_pool(), *to = world_without_pool(), *bad = world_without_pool();
	int keep, mem, wake, junk = eventfd(0, EFD_CLOEXEC);

	peerpool_adopt(&from->c, pool_memfd(POOL_LEN, ALL_SEALS, 0), wake_pair(&keep));
	CHECK(from->c.rx_pool != NULL);
	/* what a hand-over carries: copies of the kept descriptors */
	mem = dup(from->c.rx_pool_fd);
	wake = dup(from->c.pool_wake_fd);
	CHECK(peerpool_inherit(&to->c, mem, wake) == 0);
	CHECK(to->c.rx_pool && !memcmp(to->c.rx_pool, "pool", 4) && to->c.rx_pool_len == POOL_LEN);
	/* the caller's descriptors stay the caller's */
	CHECK(!closed(mem) && !closed(wake) && to->c.rx_pool_fd != mem);
	/* no acknowledgement: the peer has it already */
	CHECK(atomic_load(&to->mine->pool_ack) == 0);
	/* checked as a hand-over from the peer is */
	CHECK(peerpool_inherit(&bad->c, mem, junk) < 0 && !bad->c.rx_pool);
	close(mem);
	close(wake);
	close(junk);
	peerpool_drop(&from->c);
	peerpool_drop(&to->c);
	close(keep);
	done(from);
	done(to);
	done(bad);
}

int main(void)
{
	test_sound_pool_taken();
	test_unsound_pools_refused();
	test_no_pool_on_shared_or_broken_connection();
	test_second_pool_refused();
	test_release_never_waits();
	test_inherit();
	return check_report("test_peerpool");
}
