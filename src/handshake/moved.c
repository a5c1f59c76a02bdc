/*
 * moved.c - what a process does with a connection that goes on over TCP
 * (core/move.c seals the rings): its descriptors of it become the TCP
 * socket, and a seccomp filter about to be installed moves every
 * connection first.
 *
 * Each process follows a move by itself, the first time a call of its own
 * finds the connection moved (hs_moved_follow, from the shim's lookups and
 * waits): the descriptor numbers that named the doorbell socket name the
 * hidden TCP socket from then on, with the program's O_NONBLOCK and
 * close-on-exec, and the epoll sets that held them hold the TCP socket
 * (io_swap_begin/_end).  What the ring still holds is read from it first
 * (rx.c); once it is empty the connection is MODE_TCP here and every call
 * goes straight to the kernel.
 *
 * A seccomp filter (hs_sandbox): OpenSSH's privilege-separated child, and
 * any program that limits its own system calls, would be killed at smclo's
 * next doorbell.  So before the filter applies every connection moves
 * and is followed at once, nothing new is accelerated, and smclo makes no
 * system call of its own from then on but close(): reads of what the rings
 * still hold are memory, and the program's own calls are made as it made
 * them.  A connection made without TCP (the direct handshake) cannot move;
 * it stays in the rings, counted and logged.
 */
#include "hs_internal.h"

#include "io.h"
#include "spin.h"
#include "stats.h"

#include <fcntl.h>
#include <pthread.h>

static pthread_mutex_t follow_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int sandboxed;

/* @fd names @c in this process: make it the TCP socket. */
static void moved_swap(int fd, struct conn *c, void *arg)
{
	int fdfl, fl;

	if (c != arg)
		return;
	fdfl = sys_fcntl(fd, F_GETFD, 0);
	/* O_NONBLOCK as the program set it (kept by our fcntl/ioctl wrappers) */
	fl = sys_fcntl(c->tcp_fd, F_GETFL, 0);
	if (fl >= 0)
		sys_fcntl(c->tcp_fd, F_SETFL, atomic_load(&c->sh->nonblock) ? fl | O_NONBLOCK
		                                                             : fl & ~O_NONBLOCK);
	/* who gets SIGURG and SIGIO: the program set it on the doorbell */
	install_carry_signals(fd, c->tcp_fd, 0);
	/* the doorbell's hang-up wakes both sides' waiters; made here, under
	 * follow_lock, while @fd still names the doorbell (core/move.c) */
	move_hang_up(fd);
	io_swap_begin(fd);
	sys_dup3(c->tcp_fd, fd, fdfl > 0 && (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	io_swap_end(fd);
	DBG("fd %d: moved to its TCP socket", fd);
}

int hs_moved_follow(struct conn *c)
{
	int unread;

	if (!atomic_load_explicit(&c->moved_here, memory_order_acquire)) {
		/* what the peer handing the connection on asked for (core/move.c,
		 * "sent again") goes before our descriptors become the TCP
		 * socket, after which the program's writes go straight there */
		move_resend_locked(c);
		pthread_mutex_lock(&follow_lock);
		if (!atomic_load(&c->moved_here)) {
			fd_for_each_conn(moved_swap, c);
			atomic_store_explicit(&c->moved_here, 1, memory_order_release);
		}
		pthread_mutex_unlock(&follow_lock);
	}
	/* bytes left, or an end the peer published in the ring before the
	 * move (no FIN on TCP may ever say it): the ring still answers */
	unread = rx_ring_holds(c);
	if (!unread)
		c->mode = MODE_TCP;     /* plain TCP to this process from now on */
	return unread;
}

/* Move @c (named by @fd here) unless it moved already or cannot. */
static void sandbox_one(int fd, struct conn *c, void *arg)
{
	int *stuck = arg;

	if (c->mode != MODE_SHM || atomic_load(&c->moved_here))
		return;
	if (!move_possible(c)) {
		DBG("fd %d: confined, and a connection without TCP beneath (at either end) "
		    "cannot move to TCP: it stays in shared memory", fd);
		++*stuck;
		return;
	}
	if (!move_seen(c))
		move_start(c, R_SANDBOX);       /* sandbox_follow hangs up */
}

/* Follow every moved connection (the table walk holds no lock to take). */
static void sandbox_follow(int fd, struct conn *c, void *arg)
{
	(void)fd;
	(void)arg;
	if (c->mode == MODE_SHM && move_flagged(c) && conn_try_ref(c)) {
		hs_moved_follow(c);
		conn_put(c);
	}
}

int hs_sandbox(void)
{
	int stuck = 0;

	if (atomic_exchange(&sandboxed, 1))
		return 0;
	hs_resolve_all();               /* nothing undecided waits on a handshake */
	spin_forbid();                  /* spinning reads /proc now and then */
	listeners_confined();            /* no offer waits for an accept() we would not serve */
	fd_for_each_conn(sandbox_one, &stuck);
	fd_for_each_conn(sandbox_follow, NULL);
	return stuck;
}

int hs_move_now(struct conn *c, int reason)
{
	if (!move_seen(c)) {
		if (!move_possible(c))
			return -1;
		move_start(c, reason);
	}
	hs_moved_follow(c);
	return 0;
}

/* An end the peer published in the ring and nothing can send again: it
 * closed, and its TCP socket went with a reset (release.c). */
static int moved_peer_closed(struct conn *c)
{
	return atomic_load_explicit(&c->rx->flags, memory_order_acquire) & (RING_F_CLOSED | RING_F_ABORT);
}

/*
 * Would a reader of the TCP socket alone miss anything the ring holds (or
 * held: what we asked the peer to send again, and it has not)?
 */
static int moved_strands(struct conn *c)
{
	uint32_t word;

	if (atomic_load_explicit(&c->sh->flags, memory_order_acquire) & SH_RESEND)
		return move_resent(c, &word) != 1;
	return rx_has_unread(c) || moved_peer_closed(c) ||
	       (atomic_load_explicit(&c->rx->flags, memory_order_acquire) & RING_F_SHUTDOWN);
}

/*
 * Seal @c for a hand-on; 1 if the peer was asked to send again what we
 * had not read (bytes, or a shutdown it published in the ring: its FIN
 * follows them), 0 if nothing was there to ask for, -1 if it cannot be
 * asked (pool references among those bytes, a peek of this thread's
 * held): unsealed then.
 */
static int moved_seal_asking(struct conn *c)
{
	int asked = 0;

	/* a peek of this thread's would consume past the cursor we give */
	if (io_hold_mine(&c->rx_hold))
		return -1;
	shared_lock(&c->sh->rx_lock);   /* our cursor is final from here */
	if (moved_strands(c))
		asked = move_ask_resend(c) == 0 ? 1 : -1;
	if (asked >= 0)
		move_start(c, R_HANDED_ON);
	shared_unlock(&c->sh->rx_lock);
	return asked;
}

/*
 * Wake the peer to the move (the doorbell's hang-up, while @fd still names
 * it: see moved_swap), then wait for it to send again what it was asked,
 * at most the handshake timeout.  0 once it has.
 */
static int moved_wait_resent(int fd, struct conn *c)
{
	long deadline = mono_now_ms() + cfg.handshake_ms;
	uint32_t word;
	int r;

	pthread_mutex_lock(&follow_lock);
	if (!atomic_load(&c->moved_here))
		move_hang_up(fd);
	pthread_mutex_unlock(&follow_lock);
	while ((r = move_resent(c, &word)) == 0 && mono_now_ms() < deadline) {
		struct timespec ts = { 0, 2000000 };      /* and a look at the peer's end */
		/* a peer handing on at the same time waits for us likewise */
		move_resend_asked(c);
		/* on the word as it is: a peer that writes others costs no spin */
		sys_futex_wait((_Atomic uint32_t *)&c->rx->resent, word, &ts);
	}
	return r == 1 ? 0 : -1;
}

int hs_hand_on_tcp(int fd, struct conn *c)
{
	int asked;

	if (c->mode != MODE_SHM || atomic_load(&c->pending) != PENDING_NONE ||
	    moved_peer_closed(c) || !move_possible(c))
		return -1;
	if (move_seen(c)) {
		/* moved already: the peer's bytes after the seal went over TCP,
		 * and nothing can be sent again in front of them */
		if (moved_strands(c))
			return -1;
		hs_moved_follow(c);
		return 0;
	}
	if ((asked = moved_seal_asking(c)) < 0)
		return -1;
	/* not asked: the peer's last bytes may have come just before the seal */
	if (asked ? moved_wait_resent(fd, c) < 0 : moved_strands(c))
		return -1;
	hs_moved_follow(c);
	return 0;
}

struct above {
	int lowest, stuck;
};

static void move_one_above(int fd, struct conn *c, void *arg)
{
	struct above *a = arg;

	if (fd >= a->lowest)
		sandbox_one(fd, c, &a->stuck);
}

int hs_move_fds_from(int lowest)
{
	struct above a = { lowest, 0 };

	fd_for_each_conn(move_one_above, &a);
	fd_for_each_conn(sandbox_follow, NULL);
	return a.stuck;
}

int hs_sandboxed(void)
{
	return atomic_load_explicit(&sandboxed, memory_order_relaxed);
}

void hs_sandboxed_tcp(void)
{
	/* counted, not listed: a new row of the table could mean a system call */
	stats_slot_decide(totals, NULL, MODE_TCP, R_SANDBOX);
}
