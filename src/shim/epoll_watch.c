/*
 * epoll_watch.c - epoll for accelerated connections: no doorbell while the
 * reader is awake, and a look at the rings before it sleeps.
 *
 * Event loops (redis, nginx) never block in read(): they sleep in
 * epoll_wait() and then read what is ready.  With doorbells alone every
 * message costs the writer a send and the reader a drain - as many system
 * calls as TCP - and often a sleep and a wake-up.  So an epoll set watches
 * its connections' rings while its thread is awake: from the moment a wait
 * returns events (the application is about to handle them and come back)
 * until a wait on the set is about to sleep in the kernel, or the thread
 * sleeps anywhere else.  While a ring is watched (its header's `watchers`)
 * the writer sends no doorbell; every wait on the set looks at the watched
 * rings itself and reports what it finds, merged with the kernel's events.
 * Before sleeping, a wait first watches for a moment (SPIN_NS, under spin.c's
 * rules: never on one CPU, never with the cores oversubscribed), asking the
 * kernel now and then about everything else.
 *
 * What keeps readiness exact:
 *  - a watch ends by decrementing `watchers` and only then looking at the
 *    ring (seq_cst on both sides, against the writer's publish-then-look):
 *    either the writer saw no watcher and rang, or the look sees its bytes;
 *  - bytes found at that last look are "owed": reported by this set's waits
 *    while they stay unread (level-triggered) or once (edge-triggered,
 *    one-shot), because no kernel event will report them;
 *  - a set with a thread asleep in it is not watched, a thread that sleeps
 *    in any of our waits first ends the watches it started, and anyone else
 *    who might sleep on such a descriptor (a blocking read, poll, select)
 *    counts itself in `sleepers` first: writers always ring while that is
 *    non-zero;
 *  - a connection is watched only when nothing else can be waiting for it
 *    unseen: one process holds it, it has exactly one registration we know
 *    of, for EPOLLIN, without EPOLLONESHOT, in a set that is neither nested
 *    in another epoll set nor reachable through a copied descriptor.  fork()
 *    ends every watch first (a child shares the epoll instance).
 * Registering a descriptor (ADD, MOD) with unread bytes reports them, as the
 * kernel would.
 *
 * Parked registrations: a DEL of an accelerated descriptor leaves its kernel
 * registration in place, asking for no events and carrying PARKED_DATA, and
 * an ADD of it to the same set takes it back with one MOD.  Event loops that
 * drop and re-add a descriptor around every request (redis-benchmark: two
 * DEL/ADD pairs a request, 65% of its CPU in epoll_ctl once the rings carry
 * the bytes) save the kernel's freeing and allocating of the registration,
 * ~1 µs a pair.  A parked registration can still report an error or hang-up,
 * once (it is one-shot); that event carries PARKED_DATA and is dropped.  To
 * the application a parked descriptor is not registered: DEL and MOD fail
 * with ENOENT, as they would.  Sets that other waiters can see (nested,
 * copied, across fork or exec) have their parked registrations removed.
 *
 * What is left: a program that waits for a watched descriptor by other
 * means (io_uring, raw system calls) - docs/design.md.
 *
 * Locking: `table_lock` guards the list of sets and every registration; a
 * set's own lock is held by a wait for its whole look and spin (bounded by
 * SPIN_NS), so a close or epoll_ctl from another thread waits at most that.
 */
#include "epoll_watch.h"
#include "fdtab.h"

#include "conn.h"
#include "handshake.h"
#include "io.h"
#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define WATCH_MAX      256      /* connections one set watches at most */
#define THREAD_SETS    4        /* sets one thread can be watching at once */
#define KERNEL_LOOK_NS 4000     /* while spinning, ask the kernel this often */
/* A parked registration's data: bit 63 set, so neither a user-space pointer nor a descriptor. */
#define PARKED_DATA    0x8000736d636c6f00ULL

struct watch_entry {
	int fd;
	uint32_t events;                /* as the application registered them */
	epoll_data_t data;
	struct conn *c;                 /* referenced */
	uint64_t seen_prod;             /* producer cursor last reported (edges) */
	uint8_t watching;               /* we count in its ring's `watchers` */
	uint8_t owed;                   /* unread bytes no kernel event will report */
	uint8_t parked;                 /* deleted by the application, kept by the kernel */
	uint8_t out_fresh;              /* added or modified: the kernel's first EPOLLOUT
	                                   is the registration's own (out_edge_due) */
	uint32_t nospace_seen;          /* conn_shared.nospace at its last EPOLLOUT edge */
};

struct watch_set {
	pthread_mutex_t lock;
	int epfd;
	int unsafe;                     /* nested or copied: watch nothing */
	int sleeping;                   /* threads asleep in the kernel on it */
	int awake;                      /* a thread handles its events and comes back:
	                                   new registrations are watched at once */
	int n, cap, n_watching, n_owed, n_parked;
	int n_exclusive;                /* level-triggered EPOLLEXCLUSIVE entries (exclusive_look) */
	struct watch_entry *e;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct watch_set **sets;
static int n_sets, cap_sets;

/* The sets this thread started watching (by descriptor: ending a watch is always safe). */
static __thread int my_sets[THREAD_SETS];
static __thread int n_my_sets;


/* ---- one entry ---------------------------------------------------------- */

static int watchable(const struct watch_set *s, const struct watch_entry *e)
{
	return !s->unsafe && !s->sleeping && !e->parked && (e->events & EPOLLIN) &&
	       !(e->events & EPOLLONESHOT) && e->c->watch_regs == 1 &&
	       atomic_load_explicit(&e->c->sh->holders, memory_order_relaxed) == 1;
}

/*
 * A level-triggered EPOLLEXCLUSIVE registration: each wait asks its
 * doorbell socket itself (exclusive_look).  (An edge-triggered one would
 * report an edge at every wait so; a MOD of either kind fails.)
 */
static int looked_at_each_wait(const struct watch_entry *e)
{
	return (e->events & EPOLLEXCLUSIVE) && !(e->events & EPOLLET);
}

static void set_owed(struct watch_set *s, struct watch_entry *e, int owed)
{
	s->n_owed += (owed != 0) - (e->owed != 0);
	e->owed = (uint8_t)(owed != 0);
}

static void entry_watch(struct watch_set *s, struct watch_entry *e)
{
	if (e->watching || s->n_watching >= WATCH_MAX || !watchable(s, e))
		return;
	atomic_fetch_add_explicit(&e->c->tx->watchers, 1, memory_order_seq_cst);
	e->watching = 1;
	s->n_watching++;
}

/* Step 1 of ending a watch: writers ring again from here. */
static void entry_stop(struct watch_set *s, struct watch_entry *e)
{
	atomic_fetch_sub_explicit(&e->c->tx->watchers, 1, memory_order_seq_cst);
	e->watching = 0;
	s->n_watching--;
}

/* Step 2: what came without a doorbell meanwhile is ours to report. */
static void entry_settle(struct watch_set *s, struct watch_entry *e)
{
	uint64_t prod = rx_prod_now(e->c);

	if (prod != __atomic_load_n(&e->c->sh->cons, __ATOMIC_RELAXED) &&
	    (!(e->events & EPOLLET) || prod != e->seen_prod))
		set_owed(s, e, 1);
}

static void entry_unwatch(struct watch_set *s, struct watch_entry *e)
{
	if (!e->watching)
		return;
	entry_stop(s, e);
	entry_settle(s, e);
}

/* ---- the table of sets (table_lock held) -------------------------------- */

static struct watch_set *set_find(int epfd)
{
	for (int i = 0; i < n_sets; i++)
		if (sets[i]->epfd == epfd)
			return sets[i];
	return NULL;
}

static struct watch_set *set_new(int epfd)
{
	struct watch_set *s;

	if (n_sets == cap_sets) {
		int cap = cap_sets ? cap_sets * 2 : 8;
		struct watch_set **n = realloc(sets, (size_t)cap * sizeof(*n));
		if (!n)
			return NULL;
		sets = n;
		cap_sets = cap;
	}
	if (!(s = calloc(1, sizeof(*s))))
		return NULL;
	pthread_mutex_init(&s->lock, NULL);
	s->epfd = epfd;
	s->unsafe = (fd_flags(epfd) & FDF_NESTED) != 0;
	sets[n_sets++] = s;
	return s;
}

/* Find @epfd's set and lock it. */
static struct watch_set *set_lock(int epfd)
{
	struct watch_set *s;

	pthread_mutex_lock(&table_lock);
	if ((s = set_find(epfd)))
		pthread_mutex_lock(&s->lock);
	pthread_mutex_unlock(&table_lock);
	return s;
}

static void entry_drop(struct watch_set *s, int i)
{
	struct watch_entry *e = &s->e[i];

	if (e->watching)
		entry_stop(s, e);
	set_owed(s, e, 0);
	s->n_parked -= e->parked;
	s->n_exclusive -= looked_at_each_wait(e);
	e->c->watch_regs--;
	conn_put(e->c);
	s->e[i] = s->e[--s->n];
}

static void set_free(struct watch_set *s)
{
	for (int i = 0; i < n_sets; i++)
		if (sets[i] == s)
			sets[i] = sets[--n_sets];
	pthread_mutex_lock(&s->lock);           /* a wait still using it finishes */
	while (s->n)
		entry_drop(s, s->n - 1);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_destroy(&s->lock);
	free(s->e);
	free(s);
}

static struct watch_entry *entry_find(struct watch_set *s, int fd)
{
	for (int i = 0; i < s->n; i++)
		if (s->e[i].fd == fd)
			return &s->e[i];
	return NULL;
}

/* Takes over the reference on @c; drops it when it cannot keep it. */
static void entry_add(struct watch_set *s, int fd, const struct epoll_event *ev, struct conn *c)
{
	struct watch_entry *e = entry_find(s, fd);

	if (e)                  /* the number was closed behind our back (close_range) */
		entry_drop(s, (int)(e - s->e));

	if (s->n == s->cap) {
		int cap = s->cap ? s->cap * 2 : 16;
		struct watch_entry *n = realloc(s->e, (size_t)cap * sizeof(*n));
		if (!n) {
			conn_put(c);    /* untracked: its writer always rings */
			return;
		}
		s->e = n;
		s->cap = cap;
	}
	e = &s->e[s->n++];
	memset(e, 0, sizeof(*e));
	e->fd = fd;
	e->events = ev->events;
	e->data = ev->data;
	e->c = c;
	e->out_fresh = 1;
	e->nospace_seen = atomic_load(&c->sh->nospace);
	s->n_exclusive += looked_at_each_wait(e);      /* (a MOD cannot change it) */
	c->watch_regs++;
	if (ev->events & EPOLLET)
		io_bell_each(c);
	set_owed(s, e, rx_lowat_met(c));  /* ADD reports what is there already */
	fd_add_flags(fd, FDF_WATCHED);
	if (s->awake)
		entry_watch(s, e);
}

/* ---- watching a whole set (its lock held) ------------------------------- */

static void thread_owns(int epfd, int own)
{
	for (int i = 0; i < n_my_sets; i++)
		if (my_sets[i] == epfd) {
			if (!own)
				my_sets[i] = my_sets[--n_my_sets];
			return;
		}
	if (own && n_my_sets < THREAD_SETS)
		my_sets[n_my_sets++] = epfd;
}

static void set_watch(struct watch_set *s)
{
	if (s->unsafe || s->sleeping)
		return;
	if (!s->awake && n_my_sets == THREAD_SETS)
		return;                 /* we could not end it when we sleep */
	s->awake = 1;
	thread_owns(s->epfd, 1);
	for (int i = 0; i < s->n && s->n_watching < WATCH_MAX; i++)
		entry_watch(s, &s->e[i]);
}

static void set_unwatch(struct watch_set *s)
{
	if (s->n_watching) {
		uint8_t was[s->n];

		for (int i = 0; i < s->n; i++)
			if ((was[i] = s->e[i].watching))
				entry_stop(s, &s->e[i]);
		for (int i = 0; i < s->n; i++)
			if (was[i])
				entry_settle(s, &s->e[i]);
	}
	s->awake = 0;
	thread_owns(s->epfd, 0);
}

/* Remove the set's parked registrations from the kernel: other waiters could see them. */
static void set_unpark(struct watch_set *s)
{
	for (int i = s->n - 1; i >= 0 && s->n_parked; i--)
		if (s->e[i].parked) {
			sys_epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->e[i].fd, NULL);
			entry_drop(s, i);
		}
}

/* ---- registrations ------------------------------------------------------ */

void epoll_watch_epoll_created(int epfd)
{
	struct watch_set *s;

	if (epfd < 0)
		return;
	pthread_mutex_lock(&table_lock);
	if ((s = set_find(epfd)))
		set_free(s);            /* the number's last owner was closed unseen */
	pthread_mutex_unlock(&table_lock);
	fd_set_flags(epfd, FDF_KNOWN | FDF_EPOLL);
}

static void mark_nested(int epfd)
{
	struct watch_set *s;

	fd_add_flags(epfd, FDF_NESTED);
	if ((s = set_lock(epfd))) {
		s->unsafe = 1;
		set_unwatch(s);
		set_unpark(s);
		pthread_mutex_unlock(&s->lock);
	}
}

void epoll_watch_epfd_copied(int epfd)
{
	if (fd_flags(epfd) & FDF_EPOLL)
		mark_nested(epfd);
}

int epoll_watch_epfd_polled(int epfd)
{
	struct watch_set *s;
	int ready = 0;

	if (!(fd_flags(epfd) & FDF_EPOLL))
		return 0;
	mark_nested(epfd);
	if ((s = set_lock(epfd))) {
		for (int i = 0; i < s->n && s->n_owed && !ready; i++)
			ready = s->e[i].owed && (s->e[i].events & EPOLLIN) && rx_lowat_met(s->e[i].c);
		pthread_mutex_unlock(&s->lock);
	}
	return ready;
}

static void entry_modify(struct watch_set *s, struct watch_entry *e, const struct epoll_event *ev)
{
	e->events = ev->events;
	e->data = ev->data;
	e->seen_prod = 0;               /* MOD re-arms: report what is there */
	e->out_fresh = 1;
	e->nospace_seen = atomic_load(&e->c->sh->nospace);
	if (ev->events & EPOLLET)
		io_bell_each(e->c);
	if (e->watching && !watchable(s, e))
		entry_unwatch(s, e);
	if (!e->watching)
		set_owed(s, e, rx_lowat_met(e->c));
	if (s->awake)
		entry_watch(s, e);
}

void epoll_watch_ctl(int epfd, int op, int fd, const struct epoll_event *ev)
{
	struct conn *c = NULL;
	struct watch_set *s;
	struct watch_entry *e;

	if (op == EPOLL_CTL_ADD && (fd_flags(fd) & FDF_EPOLL))
		mark_nested(fd);
	if (op == EPOLL_CTL_ADD) {
		if (!fd_has_conn(fd) || !(c = fd_get_conn(fd)))
			return;
		if (c->mode != MODE_SHM) {
			conn_put(c);
			return;
		}
	} else if (!(fd_flags(fd) & FDF_WATCHED)) {
		return;
	}
	pthread_mutex_lock(&table_lock);
	s = set_find(epfd);
	if (!s && c)
		s = set_new(epfd);
	if (!s) {
		pthread_mutex_unlock(&table_lock);
		if (c)
			conn_put(c);
		return;
	}
	pthread_mutex_lock(&s->lock);
	if (c)
		entry_add(s, fd, ev, c);
	else if ((e = entry_find(s, fd)) && op == EPOLL_CTL_DEL)
		entry_drop(s, (int)(e - s->e));
	else if (e && op == EPOLL_CTL_MOD && ev)
		entry_modify(s, e, ev);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&table_lock);
}

/* ---- parked registrations ------------------------------------------------ */

/* DEL: keep the kernel's registration, asking for nothing; 0, or WATCH_PASS to DEL for real. */
static int entry_park(struct watch_set *s, struct watch_entry *e)
{
	struct epoll_event off = { .events = EPOLLONESHOT, .data.u64 = PARKED_DATA };

	if (s->unsafe || e->c->mode != MODE_SHM ||
	    sys_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &off) < 0)
		return WATCH_PASS;      /* (an EPOLLEXCLUSIVE one cannot be modified) */
	if (e->watching)
		entry_stop(s, e);
	set_owed(s, e, 0);
	e->parked = 1;
	s->n_parked++;
	fd_add_flags(e->fd, FDF_PARKED);
	return 0;
}

/*
 * An ADD to another set (an event loop handing a connection to another
 * thread's loop): the parked registrations go for real, or the descriptor
 * would count two registrations and neither set could watch it.
 */
static void unpark_elsewhere(int fd, const struct watch_set *except)
{
	for (int i = 0; i < n_sets; i++) {
		struct watch_set *s = sets[i];
		struct watch_entry *e;

		if (s == except || !s->n_parked)
			continue;
		pthread_mutex_lock(&s->lock);
		if ((e = entry_find(s, fd)) && e->parked) {
			sys_epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
			entry_drop(s, (int)(e - s->e));
		}
		pthread_mutex_unlock(&s->lock);
	}
}

/* ADD of a parked descriptor: 0, or WATCH_PASS (dropped) to ADD afresh. */
static int entry_revive(struct watch_set *s, struct watch_entry *e, struct epoll_event *ev)
{
	e->parked = 0;
	s->n_parked--;
	if (!(ev->events & EPOLLEXCLUSIVE) && sys_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, ev) == 0) {
		entry_modify(s, e, ev);
		return 0;
	}
	/* the number names another file now (closed unseen), or the kernel
	 * must be asked for what a MOD cannot give */
	sys_epoll_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, NULL);
	entry_drop(s, (int)(e - s->e));
	return WATCH_PASS;
}

/* One entry's states: registered --DEL--> parked --ADD--> registered. */
static int entry_ctl(struct watch_set *s, struct watch_entry *e, int op, struct epoll_event *ev)
{
	if (!e->parked)
		return op == EPOLL_CTL_DEL ? entry_park(s, e) : WATCH_PASS;
	if (op == EPOLL_CTL_ADD)
		return entry_revive(s, e, ev);
	errno = ENOENT;         /* DEL, MOD: not registered, to the application */
	return -1;
}

int epoll_watch_ctl_parked(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct watch_set *s;
	struct watch_entry *e;
	uint16_t f = fd_flags(fd);
	int rc = WATCH_PASS;

	/* a MOD or ADD looks only at descriptors that were ever parked (the
	 * flag stays): the event loops that MOD every request pay nothing */
	if (!(f & FDF_WATCHED) || (op != EPOLL_CTL_DEL && !(f & FDF_PARKED)) ||
	    (op == EPOLL_CTL_ADD && !ev))
		return WATCH_PASS;
	pthread_mutex_lock(&table_lock);
	s = set_find(epfd);
	if (op == EPOLL_CTL_ADD)
		unpark_elsewhere(fd, s);
	if (s) {
		pthread_mutex_lock(&s->lock);
		if ((e = entry_find(s, fd)))
			rc = entry_ctl(s, e, op, ev);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&table_lock);
	return rc;
}

int epoll_watch_drop_parked(struct epoll_event *ev, int n)
{
	int kept = 0;

	for (int i = 0; i < n; i++)
		if (ev[i].data.u64 != PARKED_DATA)
			ev[kept++] = ev[i];
	return n > 0 ? kept : n;
}

void epoll_watch_fd_closed(int fd)
{
	uint16_t f = fd_flags(fd);
	struct watch_set *s;

	if (!(f & (FDF_WATCHED | FDF_EPOLL)))
		return;
	pthread_mutex_lock(&table_lock);
	if ((f & FDF_EPOLL) && (s = set_find(fd)))
		set_free(s);
	for (int i = 0; (f & FDF_WATCHED) && i < n_sets; i++) {
		s = sets[i];
		pthread_mutex_lock(&s->lock);
		for (int k = s->n - 1; k >= 0; k--)
			if (s->e[k].fd == fd)
				entry_drop(s, k);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&table_lock);
}

/* ---- fork and exec: a child shares the epoll instances ------------------- */

static void unwatch_all(void)
{
	for (int i = 0; i < n_sets; i++) {
		pthread_mutex_lock(&sets[i]->lock);
		set_unwatch(sets[i]);
		set_unpark(sets[i]);
		pthread_mutex_unlock(&sets[i]->lock);
	}
}

void epoll_watch_fork_prepare(void)
{
	pthread_mutex_lock(&table_lock);
	unwatch_all();
}

void epoll_watch_fork_parent(void)
{
	pthread_mutex_unlock(&table_lock);
}

void epoll_watch_fork_child(void)
{
	/* the only thread left: set locks other parent threads held are void */
	for (int i = 0; i < n_sets; i++) {
		pthread_mutex_init(&sets[i]->lock, NULL);
		sets[i]->sleeping = 0;
	}
	pthread_mutex_unlock(&table_lock);      /* ours: taken in prepare */
}

void epoll_watch_before_exec(void)
{
	pthread_mutex_lock(&table_lock);
	unwatch_all();
	pthread_mutex_unlock(&table_lock);
}

/* ---- waiting ------------------------------------------------------------ */

/* Add (or merge into an event with the same data) one event. */
static void put_event(struct epoll_event *ev, int *n, int max, epoll_data_t data, uint32_t events)
{
	for (int i = 0; i < *n; i++)
		if (ev[i].data.u64 == data.u64) {
			ev[i].events |= events;
			return;
		}
	if (*n < max) {
		ev[*n].events = events;
		ev[*n].data = data;
		(*n)++;
	}
}

/* One-shot: arm the kernel's registration again, as the application had it. */
static void rearm(struct watch_set *s, struct watch_entry *e)
{
	struct epoll_event on = { .events = e->events, .data = e->data };

	sys_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &on);
}

/*
 * An edge-triggered EPOLLOUT with no input beside it is the doorbell socket
 * getting room as the reader drains it - which it does in steps, each an
 * edge.  TCP raises one only after a write found no room (SOCK_NOSPACE),
 * and once after the registration was made: so do we.
 */
static int out_edge_due(struct watch_entry *e)
{
	uint32_t now = atomic_load_explicit(&e->c->sh->nospace, memory_order_relaxed);
	int due = e->out_fresh || now != e->nospace_seen;

	/* the room it reports is the room a write lacked: both are spent */
	e->out_fresh = 0;
	e->nospace_seen = now;
	return due;
}

/*
 * An event from the kernel for entry @e (NULL: not one of ours), seen
 * against the rings.  An EPOLLIN for an empty ring whose stream goes on is
 * a doorbell that arrived after we reported its bytes and the application
 * read them (a writer can be preempted between counting a doorbell and
 * sending it); passing it on would be a readable descriptor with nothing
 * to read - wrk counts that as an error - so it is consumed and the event
 * dropped.  A real one is the edge for every byte there now: an
 * edge-triggered reader reads them all, so we report no other.
 */
static uint32_t entry_event(struct watch_set *s, struct watch_entry *e, uint32_t events)
{
	/* the hang-up of a moved connection's doorbell socket (core/move.c),
	 * before this process followed it: the next wait follows first */
	if (e && !atomic_load(&e->c->moved_here) && move_flagged(e->c))
		return 0;
	if (e && e->c->mode == MODE_SHM) {
		/* as TCP would say it; but a level-triggered hang-up turned into
		 * nothing would come back at once, for ever: it stays */
		uint32_t tcp = (uint16_t)tcpend_poll_events(e->c, (short)events, (short)e->events);

		if (tcp)
			events = tcp | (events & ~0xffffu);
	}
	if (e && e->c->mode == MODE_SHM && (e->events & EPOLLET) && (events & EPOLLOUT) &&
	    !(events & EPOLLIN) && !out_edge_due(e))
		events &= ~(uint32_t)(EPOLLOUT | EPOLLWRNORM);
	if (!(events & EPOLLIN) || !e || e->c->watch_regs != 1)
		return events;
	if (!rx_lowat_met(e->c) && !(events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) &&
	    rx_settle_bells(e->c, e->fd)) {
		events &= ~(uint32_t)(EPOLLIN | EPOLLRDNORM);
		/*
		 * A one-shot registration disarmed itself to deliver this event,
		 * and the application will not see it: it would never arm the
		 * registration again, and the next bytes would never be
		 * reported (the stress test's one-shot server hung so, with
		 * 679 KB unread).  Arm it again for it; the kernel looks at
		 * the descriptor as it does, so a doorbell that came meanwhile
		 * is reported.
		 */
		if (!events && (e->events & EPOLLONESHOT))
			rearm(s, e);
		return events;
	}
	e->seen_prod = rx_prod_now(e->c);
	return events;
}

/* The same for an event the kernel reported with @data. */
static uint32_t kernel_event(struct watch_set *s, epoll_data_t data, uint32_t events)
{
	struct watch_entry *e = NULL;

	if (data.u64 == PARKED_DATA)
		return 0;
	for (int i = 0; i < s->n && !e; i++)
		if (s->e[i].data.u64 == data.u64 && !s->e[i].parked)
			e = &s->e[i];
	return entry_event(s, e, events);
}

/* What the kernel has ready now, after the @n events already in @ev (-1 on error, n == 0 only). */
static int kernel_look(struct watch_set *s, struct epoll_event *ev, int n, int max)
{
	struct epoll_event got[64];
	int k = sys_epoll_look(s->epfd, got, max - n < 64 ? max - n : 64);

	if (k < 0)
		return n ? n : -1;      /* -1: the real wait says why */
	for (int i = 0; i < k; i++) {
		uint32_t events = kernel_event(s, got[i].data, got[i].events);
		if (events)
			put_event(ev, &n, max, got[i].data, events);
	}
	return n;
}

/*
 * A level-triggered EPOLLEXCLUSIVE registration of a doorbell socket is
 * now and then reported late: a look on its set right after another set
 * holding the socket reported the room a drain made finds nothing, one
 * 50 ms later finds it (1 or 2 drains in 100, also with a plain socket pair
 * and no smclo; a thread asleep in the set is woken).  The kernel wakes a
 * socket's exclusive entries after all the others, which may be why; not
 * established.  TCP's socket showed no such delay (the differential case
 * readiness-full-epoll), so each wait asks such a socket itself - one
 * poll() each, for the few programs that register a connection so - while
 * the descriptor still names the entry's connection (a number closed
 * behind our back, by raw system calls, may name another file now).
 */
static int exclusive_look(struct watch_set *s, struct epoll_event *ev, int n, int max)
{
	for (int i = 0; i < s->n && s->n_exclusive && n < max; i++) {
		struct watch_entry *e = &s->e[i];
		struct fd_entry *f = fd_entry(e->fd);
		struct pollfd p = { .fd = e->fd, .events = (short)(e->events & (EPOLLIN | EPOLLOUT)) };
		uint32_t events;

		if (!looked_at_each_wait(e) || e->parked || e->c->mode != MODE_SHM || !f ||
		    atomic_load_explicit(&f->conn, memory_order_relaxed) != e->c ||
		    sys_poll(&p, 1, 0) != 1 || (p.revents & POLLNVAL))
			continue;
		events = entry_event(s, e, (uint16_t)p.revents);
		if (events)
			put_event(ev, &n, max, e->data, events);
	}
	return n;
}

/* One-shot: the kernel's registration is disarmed with the event we report. */
static void disarm(struct watch_set *s, struct watch_entry *e)
{
	struct epoll_event off = { .events = e->events & (EPOLLET | EPOLLONESHOT), .data = e->data };

	sys_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &off);
}

/*
 * What an entry whose ring has bytes reports: the kernel would give the
 * whole mask it asked for at once - with EPOLLOUT while there is room, which
 * a one-shot registration disarmed here would never report otherwise.
 */
static uint32_t ring_events(const struct watch_entry *e)
{
	uint32_t ev = EPOLLIN | (e->events & EPOLLRDNORM);

	if ((e->events & EPOLLOUT) && tx_has_room(e->c))
		ev |= EPOLLOUT | (e->events & EPOLLWRNORM);
	return ev;
}

/* Report watched and owed descriptors with unread bytes, after the @n events in @ev. */
static int report_ready(struct watch_set *s, struct epoll_event *ev, int n, int max)
{
	if (!s->n_watching && !s->n_owed)
		return n;
	for (int i = 0; i < s->n && n < max; i++) {
		struct watch_entry *e = &s->e[i];
		uint64_t prod;

		if (!e->watching && !e->owed)
			continue;
		prod = rx_prod_now(e->c);
		if (!rx_ring_readable(e->c)) {
			set_owed(s, e, 0);      /* empty, or under SO_RCVLOWAT's mark */
			continue;
		}
		if (!(e->events & EPOLLIN) || ((e->events & EPOLLET) && prod == e->seen_prod))
			continue;       /* not asked for now, or no new edge */
		put_event(ev, &n, max, e->data, ring_events(e));
		e->seen_prod = prod;
		if (e->events & EPOLLONESHOT)
			disarm(s, e);
		if (e->events & (EPOLLET | EPOLLONESHOT))
			set_owed(s, e, 0);
	}
	return n;
}

/* Where the peers of the set's connections run, as a spin weighs it (spin.h). */
static uint32_t peers_cpu(struct watch_set *s)
{
	uint32_t cpu = 0, mine;

	if (!spin_confined())
		return 0;
	mine = spin_cpu_tag();
	for (int i = 0; i < s->n && (!cpu || cpu == mine); i++)
		cpu = spin_peer_pick(cpu, io_peer_cpu(s->e[i].c), mine);
	return cpu;
}

/* Watch the rings (and the kernel, every KERNEL_LOOK_NS) until something is ready or the spin ends. */
static int spin_watch(struct watch_set *s, struct epoll_event *ev, int max)
{
	int n = 0, way;
	long long until = spin_deadline(peers_cpu(s), &way), next_look;

	if (!until)
		return 0;
	set_watch(s);
	next_look = mono_now_ns() + KERNEL_LOOK_NS;
	for (;;) {
		long long now;

		for (int k = 0; k < spin_looks(way, 16) && !n; k++) {
			n = report_ready(s, ev, 0, max);
			spin_relax(way);
		}
		if (n)
			return n;
		now = mono_now_ns();
		if (now >= next_look) {
			if ((n = kernel_look(s, ev, 0, max)) > 0)
				return n;
			next_look = now + KERNEL_LOOK_NS;
		}
		if (now >= until)
			return 0;
	}
}

/*
 * Connections of @epfd moved to TCP that this process has not followed yet
 * (core/move.c): followed now, which moves their registrations to the TCP
 * socket (epoll_watch_swap_*), outside the set's lock the swap takes.
 */
static void follow_moved(int epfd)
{
	struct conn *moved[16];
	struct watch_set *s;
	int n = 0;

	if (!(s = set_lock(epfd)))
		return;
	for (int i = 0; i < s->n && n < 16; i++) {
		struct conn *c = s->e[i].c;
		if (c->mode == MODE_SHM && !atomic_load(&c->moved_here) && move_flagged(c) &&
		    conn_try_ref(c))
			moved[n++] = c;
	}
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < n; i++) {
		if (move_seen(moved[i]))
			hs_moved_follow(moved[i]);
		conn_put(moved[i]);
	}
}

/*
 * Under a seccomp filter (handshake/moved.c) every connection is on TCP:
 * what the rings still hold is reported from memory, and otherwise the
 * program's own wait goes to the kernel - no call of ours beside it.
 */
static int sandboxed_wait(int epfd, struct epoll_event *ev, int max)
{
	struct watch_set *s = set_lock(epfd);
	int n;

	if (!s)
		return WATCH_PASS;
	n = report_ready(s, ev, 0, max);
	pthread_mutex_unlock(&s->lock);
	return n > 0 ? n : WATCH_PASS;
}

int epoll_watch_before_wait(int epfd, struct epoll_event *ev, int max, int timeout, int may_spin)
{
	struct watch_set *s;
	int n;

	if (!(fd_flags(epfd) & FDF_EPOLL) || max <= 0)
		return WATCH_PASS;
	if (hs_sandboxed())
		return sandboxed_wait(epfd, ev, max);
	follow_moved(epfd);
	if (!(s = set_lock(epfd)))
		return WATCH_PASS;
	n = report_ready(s, ev, 0, max);
	if (n < max)
		n = kernel_look(s, ev, n, max);
	if (n >= 0 && n < max)
		n = exclusive_look(s, ev, n, max);
	if (n == 0 && timeout != 0) {
		if (may_spin)
			n = spin_watch(s, ev, max);
		if (n == 0) {
			/* going to sleep: end the watch, then report what it left us */
			set_unwatch(s);
			n = report_ready(s, ev, 0, max);
		}
	}
	if (n > 0)
		set_watch(s);           /* awake: the application handles these and comes back */
	else if (n == 0 && timeout != 0)
		s->sleeping++;
	pthread_mutex_unlock(&s->lock);
	if (n < 0)
		return WATCH_PASS;
	if (n == 0 && timeout != 0) {
		epoll_watch_thread_sleeps();
		return WATCH_SLEEP;
	}
	return n;
}

int epoll_watch_after_sleep(int epfd, struct epoll_event *ev, int n)
{
	struct watch_set *s = set_lock(epfd);
	int kept = 0;

	if (!s)
		return n;
	if (s->sleeping > 0)
		s->sleeping--;
	for (int i = 0; i < n; i++) {
		uint32_t events = kernel_event(s, ev[i].data, ev[i].events);
		if (events) {
			ev[kept].data = ev[i].data;
			ev[kept++].events = events;
		}
	}
	if (kept > 0)
		set_watch(s);
	pthread_mutex_unlock(&s->lock);
	return n > 0 ? kept : n;
}

void epoll_watch_thread_sleeps(void)
{
	while (n_my_sets > 0) {
		int epfd = my_sets[n_my_sets - 1];
		struct watch_set *s = set_lock(epfd);

		if (!s) {
			thread_owns(epfd, 0);
			continue;
		}
		set_unwatch(s);         /* drops it from my_sets */
		pthread_mutex_unlock(&s->lock);
	}
}

/* ---- a connection moved to TCP (core/move.c, handshake/moved.c) ------------ */

/*
 * Around the dup3 that puts the TCP socket at @fd: its registrations leave
 * the doorbell socket (a parked one for good: the program deleted it) and
 * come back on the TCP socket, with the program's events and data.  From
 * then on the kernel's events for it are TCP's; the ring's last bytes are
 * owed until read.
 */
/* @fn on @fd's entry in every set that has one, each set locked. */
static void each_entry_of(int fd, void (*fn)(struct watch_set *s, struct watch_entry *e))
{
	if (!(fd_flags(fd) & FDF_WATCHED))
		return;
	pthread_mutex_lock(&table_lock);
	for (int i = 0; i < n_sets; i++) {
		struct watch_set *s = sets[i];
		struct watch_entry *e;

		pthread_mutex_lock(&s->lock);
		if ((e = entry_find(s, fd)))
			fn(s, e);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&table_lock);
}

static void swap_leave(struct watch_set *s, struct watch_entry *e)
{
	sys_epoll_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, NULL);
	if (e->parked) {
		fd_clear_flags(e->fd, FDF_PARKED);
		entry_drop(s, (int)(e - s->e));
	}
}

static void swap_return(struct watch_set *s, struct watch_entry *e)
{
	struct epoll_event on = { .events = e->events, .data = e->data };

	sys_epoll_ctl(s->epfd, EPOLL_CTL_ADD, e->fd, &on);
	if (e->watching)
		entry_stop(s, e);
	e->seen_prod = ~0ull;   /* a new registration's edge */
	set_owed(s, e, rx_ring_readable(e->c));
}

void epoll_watch_swap_begin(int fd)
{
	each_entry_of(fd, swap_leave);
}

void epoll_watch_swap_end(int fd)
{
	each_entry_of(fd, swap_return);
}
