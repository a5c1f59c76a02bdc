/*
 * pairs.c - socket pairs made ahead for inbox offers (see pairs.h).
 *
 * The ready pairs sit in a tiny array under a spinning lock held only to
 * copy, never across a system call (as in deferred.c).
 */
#include "pairs.h"

#include "conn.h"
#include "io.h"
#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAIRS_AHEAD 2

struct ready_pair {
	int fd[2];
	uid_t euid;             /* who made it: the server sees this uid */
};

static atomic_flag lock = ATOMIC_FLAG_INIT;
static struct ready_pair ready[PAIRS_AHEAD];
static _Atomic int nready;
static _Atomic int wanted;      /* this process has made an offer */

/* A new pair, our end prepared; the other end hidden too when it will wait. */
static int pair_make(int pair[2], int hide_theirs)
{
	int sndbuf = SIDE_SNDBUF;

	if (sys_socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
		return -1;
	sys_setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	pair[0] = io_keep_fd(pair[0]);
	if (hide_theirs)
		pair[1] = io_keep_fd(pair[1]);
	return 0;
}

static void pair_close(const int pair[2])
{
	sys_close(pair[0]);
	sys_close(pair[1]);
}

int pairs_take(int pair[2])
{
	struct ready_pair p = { .fd = { -1, -1 } };

	atomic_store_explicit(&wanted, 1, memory_order_relaxed);
	if (atomic_load_explicit(&nready, memory_order_relaxed)) {
		spin_lock_take(&lock);
		if (nready > 0) {
			p = ready[nready - 1];
			atomic_store_explicit(&nready, nready - 1, memory_order_relaxed);
		}
		spin_lock_drop(&lock);
	}
	if (p.fd[0] >= 0) {
		if (p.euid == geteuid()) {
			pair[0] = p.fd[0];
			pair[1] = p.fd[1];
			return 1;
		}
		pair_close(p.fd);       /* made under another uid: not ours to offer now */
	}
	return pair_make(pair, 0);
}

int pairs_refill(void)
{
	struct ready_pair p;
	int kept = 0;

	if (!atomic_load_explicit(&wanted, memory_order_relaxed) ||
	    atomic_load_explicit(&nready, memory_order_relaxed) >= PAIRS_AHEAD)
		return 0;
	/*
	 * Out of descriptors, or of room above the application's range (a
	 * waiting pair must not hold one of its numbers): no more tries until
	 * the next offer, not one per spin.
	 */
	if (pair_make(p.fd, 1) < 0) {
		atomic_store_explicit(&wanted, 0, memory_order_relaxed);
		return 0;
	}
	if (!io_is_kept(p.fd[0]) || !io_is_kept(p.fd[1])) {
		pair_close(p.fd);
		atomic_store_explicit(&wanted, 0, memory_order_relaxed);
		return 1;
	}
	p.euid = geteuid();
	spin_lock_take(&lock);
	if (nready < PAIRS_AHEAD) {
		ready[nready] = p;
		atomic_store_explicit(&nready, nready + 1, memory_order_relaxed);
		kept = 1;
	}
	spin_lock_drop(&lock);
	if (!kept)
		pair_close(p.fd);       /* another thread filled the last place */
	return 1;
}

void pairs_drop(void)
{
	struct ready_pair p[PAIRS_AHEAD];
	int n;

	spin_lock_take(&lock);
	n = nready;
	for (int i = 0; i < n; i++)
		p[i] = ready[i];
	atomic_store_explicit(&nready, 0, memory_order_relaxed);
	spin_lock_drop(&lock);
	for (int i = 0; i < n; i++)
		pair_close(p[i].fd);
}

void pairs_after_fork(void)
{
	atomic_flag_clear(&lock);       /* a thread of the parent may have held it */
	pairs_drop();
}
