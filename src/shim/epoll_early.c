/*
 * epoll_early.c - epoll registrations made before connect(), moved across
 * the switch.
 *
 * nginx (and every event loop that opens its upstream connections so) puts
 * a socket into its epoll set before connect().  A registration names the
 * file it was made for: when the switch puts the doorbell socket in the
 * descriptor's place, the set would go on watching the TCP socket, now
 * hidden and silent, and the program would wait forever.  So each such
 * registration is recorded here (set, events, data), taken out of its set
 * just before the switch, while the descriptor still names the TCP socket,
 * and made again right after on what the descriptor names now
 * (epoll_early_swap_begin/_end, the io_hooks the handshake calls around its
 * dup3), through a copy of the set's descriptor kept while registrations
 * recorded in it last (one per set): the program may close its own number
 * of a set it still reaches by another.  A
 * level-triggered registration reports what is ready at once; an
 * edge-triggered one gets the first edge a new registration gets.  Any
 * set that holds the descriptor is moved: sets of this process and sets
 * shared with fork children alike (the registration is the set's, not the
 * process's).
 *
 * Such a connection never goes pending (handshake/client.c): it is decided
 * inside connect(), so the program, asleep in its set, never waits for a
 * decision nothing would make.  The one exception is a connection to a
 * listener that defers accept, pending until its first bytes went over TCP
 * (hs_send_prefix).  Deciding it at its first write would hold an event
 * loop (ab, a proxy) in that write until the server accepts - behind
 * connections the loop itself has not finished, which the server waits on
 * (apache2's lingering close waits for the client's close): every loop
 * stalled.  So from its first write the sets that hold it watch its
 * doorbell too (epoll_early_bell_watch: the same data, only what reads),
 * and the program, woken by the server's answer - in the ring, with a
 * doorbell, or over TCP after a decline - decides it at its read.  The
 * doorbell never hangs up meanwhile: the client keeps the server's end of
 * the pair open until the decision (client.c).  A set that cannot watch it
 * decides at the first write, and a wait on a set that holds such a
 * connection unwatched decides it first (epoll_early_before_wait).  A
 * registration that could not be recorded (no memory) leaves its
 * connection on TCP (FDF_EPOLL_LOST, R_EPOLL_EARLY).
 */
#include "epoll_early.h"
#include "interpose.h"

#include "fdtab.h"
#include "epoll_watch.h"
#include "handshake.h"

#include "sys.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>

struct early_reg {
	int fd, epfd;                   /* the program's descriptors; epfd -1 once it closed it */
	int set;                        /* our copy of the set's descriptor (struct early_set):
	                                   a set the program reaches by another number (dup)
	                                   lives on */
	struct epoll_event ev;
	int moving;                     /* taken out of its set for the switch */
	int bell;                       /* the pending connection's doorbell, watched
	                                   in the set beside it; -1 none */
	uint64_t bell_tag;              /* the data its registration carries (BELL_TAG) */
};

/*
 * A doorbell's registration carries a tag of ours, never the program's
 * data: a wait turns its event into the program's, merged with an event of
 * the TCP socket's registration in the same batch (epoll_early_after_wait),
 * so the program never sees two events with one data.  The tag's high bits
 * are smclo's mark, as PARKED_DATA's are (epoll_watch.c).
 */
#define BELL_TAG 0x8000736200000000ULL     /* "sb" and a sequence number */
static uint32_t bell_seq;
static _Atomic int n_bells;             /* doorbells watched, for a look without the lock */

static pthread_mutex_t early_lock = PTHREAD_MUTEX_INITIALIZER;
static struct early_reg *regs;
static int n_regs, cap_regs;

/*
 * The copies of the program's sets: one per set, shared by the
 * registrations recorded in it, closed with the last of them.  An event
 * loop adds, drops and adds a connection's socket again before it is
 * decided (ab: for writing, then for reading); a copy of its own for each
 * cost three system calls each time (dup, fstat, close).
 */
struct early_set {
	int epfd;                       /* the program's number; -1 once it closed it */
	int copy;                       /* ours */
	int regs;                       /* registrations recorded through it */
};
static struct early_set *sets;
static int n_sets, cap_sets;

/* Our copy of set @epfd for one more registration, or -1. */
static int set_copy_take(int epfd)
{
	int copy;

	for (int i = 0; i < n_sets; i++)
		if (sets[i].epfd == epfd) {
			sets[i].regs++;
			return sets[i].copy;
		}
	if (n_sets == cap_sets) {
		int cap = cap_sets ? 2 * cap_sets : 4;
		struct early_set *v = realloc(sets, (size_t)cap * sizeof(*v));
		if (!v)
			return -1;
		sets = v;
		cap_sets = cap;
	}
	if ((copy = fd_keep_copy(epfd, 0)) < 0)
		return -1;
	sets[n_sets++] = (struct early_set){ .epfd = epfd, .copy = copy, .regs = 1 };
	return copy;
}

/* A registration through @copy is gone. */
static void set_copy_put(int copy)
{
	for (int i = 0; i < n_sets; i++)
		if (sets[i].copy == copy) {
			if (--sets[i].regs == 0) {
				sys_close(copy);
				sets[i] = sets[--n_sets];
			}
			return;
		}
}

/* The program closed its number @fd: a new set may get it. */
static void set_copy_unname(int fd)
{
	for (int i = 0; i < n_sets; i++)
		if (sets[i].epfd == fd)
			sets[i].epfd = -1;
}
static _Atomic int n_moving;            /* registrations between swap_begin and _end */
static _Atomic int n_regs_any;          /* n_regs, for a look without the lock */

static struct early_reg *early_find(int epfd, int fd)
{
	for (int i = 0; i < n_regs; i++)
		if (regs[i].fd == fd && regs[i].epfd == epfd)
			return &regs[i];
	return NULL;
}

#define BELL_READS (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP | EPOLLPRI)

/*
 * What the doorbell's registration for @r asks for: what the program's
 * reads (nothing yet, for a program that waits to write: its MOD for
 * reading arms it), once - one-shot, armed again by every MOD of the
 * program's: the doorbell's first event is the answer the program waits
 * for, and a hang-up (a server that moved the connection at once) must
 * not come back at every wait.
 */
static struct epoll_event bell_event(const struct early_reg *r)
{
	return (struct epoll_event){
		.events = (r->ev.events & (BELL_READS | EPOLLWAKEUP)) | EPOLLONESHOT,
		.data.u64 = r->bell_tag };
}

static void bell_drop(struct early_reg *r)
{
	REAL(epoll_ctl);

	if (r->bell >= 0) {
		real_epoll_ctl(r->set, EPOLL_CTL_DEL, r->bell, NULL);
		n_bells--;
	}
	r->bell = -1;
}

static void early_drop(int i)
{
	bell_drop(&regs[i]);
	set_copy_put(regs[i].set);
	regs[i] = regs[--n_regs];
	n_regs_any = n_regs;
}

/* Record ADD or MOD of @fd in @epfd; 0, or -1 when there is no room. */
static int early_note(int epfd, int fd, const struct epoll_event *ev)
{
	struct early_reg *r = early_find(epfd, fd);

	if (!r) {
		int set = set_copy_take(epfd);
		if (set < 0)
			return -1;
		if (n_regs == cap_regs) {
			int cap = cap_regs ? 2 * cap_regs : 16;
			struct early_reg *v = realloc(regs, (size_t)cap * sizeof(*v));
			if (!v) {
				set_copy_put(set);
				return -1;
			}
			regs = v;
			cap_regs = cap;
		}
		r = &regs[n_regs++];
		n_regs_any = n_regs;
		*r = (struct early_reg){ .fd = fd, .epfd = epfd, .set = set, .bell = -1 };
	}
	r->ev = ev ? *ev : (struct epoll_event){ 0 };
	if (r->bell >= 0) {             /* a MOD: the doorbell's follows */
		REAL(epoll_ctl);
		struct epoll_event b = bell_event(r);
		real_epoll_ctl(r->set, EPOLL_CTL_MOD, r->bell, &b);
	}
	return 0;
}

void epoll_early_ctl(int epfd, int op, int fd, const struct epoll_event *ev)
{
	struct early_reg *r;
	int lost = 0;

	pthread_mutex_lock(&early_lock);
	if (op == EPOLL_CTL_DEL) {
		if ((r = early_find(epfd, fd))) {
			n_moving -= r->moving;
			early_drop((int)(r - regs));
		}
	} else {
		lost = early_note(epfd, fd, ev) < 0;
	}
	pthread_mutex_unlock(&early_lock);
	if (op == EPOLL_CTL_ADD)
		fd_epoll_early(fd, 1);
	else if (op == EPOLL_CTL_DEL)
		fd_epoll_early(fd, -1);
	if (lost)
		fd_add_flags(fd, FDF_EPOLL_LOST);
}

/* Drop the registrations recorded for socket @fd.  Lock held. */
static void early_forget_socket(int fd)
{
	for (int i = n_regs - 1; i >= 0; i--)
		if (regs[i].fd == fd) {
			n_moving -= regs[i].moving;
			early_drop(i);
		}
}

void epoll_early_fd_closed(int fd)
{
	pthread_mutex_lock(&early_lock);
	early_forget_socket(fd);
	for (int i = 0; i < n_regs; i++)
		if (regs[i].epfd == fd)
			regs[i].epfd = -1;      /* the set may live on under another number */
	set_copy_unname(fd);
	pthread_mutex_unlock(&early_lock);
}

int epoll_early_names_set(int fd)
{
	int named = 0;

	if (!atomic_load_explicit(&n_regs_any, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n_sets && !named; i++)
		named = sets[i].epfd == fd;
	pthread_mutex_unlock(&early_lock);
	return named;
}

void epoll_early_forget(int fd)
{
	if (!fd_epoll_early_count(fd))
		return;
	pthread_mutex_lock(&early_lock);
	early_forget_socket(fd);
	pthread_mutex_unlock(&early_lock);
	fd_epoll_early(fd, 0);
}

void epoll_early_epoll_created(int epfd)
{
	if (epfd < 0 || !n_regs_any)
		return;
	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n_regs; i++)
		if (regs[i].epfd == epfd)
			regs[i].epfd = -1;
	set_copy_unname(epfd);
	pthread_mutex_unlock(&early_lock);
}

void epoll_early_swap_begin(int fd)
{
	REAL(epoll_ctl);

	if (!fd_epoll_early_count(fd))
		return;         /* every connection comes here: most have none */
	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n_regs; i++)
		if (regs[i].fd == fd) {
			real_epoll_ctl(regs[i].set, EPOLL_CTL_DEL, fd, NULL);
			regs[i].moving = 1;
			n_moving++;
		}
	pthread_mutex_unlock(&early_lock);
}

/* The registrations are ordinary ones from now on: forgotten here. */
void epoll_early_swap_end(int fd)
{
	REAL(epoll_ctl);

	if (!n_moving)
		return;
	pthread_mutex_lock(&early_lock);
	for (int i = n_regs - 1; i >= 0; i--) {
		struct early_reg r = regs[i];
		if (r.fd != fd || !r.moving)
			continue;
		if (real_epoll_ctl(r.set, EPOLL_CTL_ADD, fd, &r.ev) == 0 && r.epfd >= 0)
			epoll_watch_ctl(r.epfd, EPOLL_CTL_ADD, fd, &r.ev);
		early_drop(i);
		n_moving--;
	}
	pthread_mutex_unlock(&early_lock);
	fd_epoll_early(fd, 0);
}

/*
 * A one-shot registration would fire twice (once for each socket), which a
 * pool of threads sharing the set relies on not to happen: such a program
 * decides at its first write, as before.
 */
static int bell_watchable(const struct early_reg *r)
{
	return !(r->ev.events & (EPOLLONESHOT | EPOLLEXCLUSIVE));
}

int epoll_early_bell_watch(int fd, int bell)
{
	REAL(epoll_ctl);
	int rc = 0;

	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n_regs && rc == 0; i++) {
		struct early_reg *r = &regs[i];
		struct epoll_event b;
		if (r->fd != fd || r->bell >= 0)
			continue;
		if (!bell_watchable(r)) {
			rc = -1;
			break;
		}
		r->bell_tag = BELL_TAG | ++bell_seq;     /* 32 bits: unique among the live ones */
		b = bell_event(r);
		if (real_epoll_ctl(r->set, EPOLL_CTL_ADD, bell, &b) == 0) {
			r->bell = bell;
			n_bells++;
		} else {
			rc = -1;
		}
	}
	pthread_mutex_unlock(&early_lock);
	if (rc < 0)
		epoll_early_bell_unwatch(fd);
	return rc;
}

/* The program's event for doorbell tag @tag, or 0 (a registration gone). */
static int bell_event_of(uint64_t tag, struct epoll_event *prog)
{
	for (int i = 0; i < n_regs; i++)
		if (regs[i].bell >= 0 && regs[i].bell_tag == tag) {
			*prog = regs[i].ev;
			return 1;
		}
	return 0;
}

int epoll_early_after_wait(struct epoll_event *ev, int n)
{
	int kept = 0;

	if (n <= 0 || !atomic_load_explicit(&n_bells, memory_order_relaxed))
		return n;
	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n; i++) {
		struct epoll_event prog;
		uint32_t rd;
		int k;

		if ((ev[i].data.u64 & ~0xffffffffULL) != BELL_TAG) {
			ev[kept++] = ev[i];
			continue;
		}
		if (!bell_event_of(ev[i].data.u64, &prog))
			continue;       /* unwatched meanwhile: the decision was made */
		/* the doorbell rang, or hung up: either way there is something to
		 * read, for a program that reads; nothing to one that waits to write */
		rd = prog.events & (EPOLLIN | EPOLLRDNORM);
		if (!rd)
			continue;
		/* the TCP socket's event for the same registration, emitted already
		 * or still to come (the entries between are moved copies) */
		for (k = 0; k < kept && ev[k].data.u64 != prog.data.u64; k++)
			;
		if (k == kept)
			for (k = i + 1; k < n && ev[k].data.u64 != prog.data.u64; k++)
				;
		if (k < n && (k < kept || k > i))
			ev[k].events |= rd;
		else
			ev[kept++] = (struct epoll_event){ .events = rd, .data = prog.data };
	}
	pthread_mutex_unlock(&early_lock);
	return kept;
}

void epoll_early_bell_unwatch(int fd)
{
	if (!fd_epoll_early_count(fd))
		return;
	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n_regs; i++)
		if (regs[i].fd == fd)
			bell_drop(&regs[i]);
	pthread_mutex_unlock(&early_lock);
}

void epoll_early_before_wait(int epfd)
{
	int fds[64], n = 0;

	if (!n_regs_any)
		return;
	pthread_mutex_lock(&early_lock);
	for (int i = 0; i < n_regs && n < 64; i++)
		if (regs[i].epfd == epfd && regs[i].bell < 0 &&
		    (fd_flags(regs[i].fd) & (FDF_PENDING | FDF_PREFIX)) == FDF_PENDING)
			fds[n++] = regs[i].fd;
	pthread_mutex_unlock(&early_lock);
	for (int i = 0; i < n; i++)
		hs_resolve_fd(fds[i]);  /* swap_begin/_end take the lock again */
}

void epoll_early_fork_lock(void)
{
	pthread_mutex_lock(&early_lock);
}

void epoll_early_fork_unlock(void)
{
	pthread_mutex_unlock(&early_lock);
}
