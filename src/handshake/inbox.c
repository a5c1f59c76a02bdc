/*
 * inbox.c - the one-message handshake's mailboxes and its decision word
 * (see inbox.h).
 *
 * Server side: one inbox per process and a small stash.  A client sends its
 * offer before its SYN, so when accept() returns a connection its offer is
 * already queued; offers for connections that are still in the accept queue
 * (or that another thread will accept) are read along the way and kept in
 * the stash until their connection comes.  Whatever waits longer than a
 * client would is dropped: that client has withdrawn.  The registry counts
 * the offers sent to any inbox; while that count has not moved since the
 * inbox was last found empty, accept() skips the recvmsg() - so a plain
 * client costs a server no system call here.
 *
 * A listener that takes connections without TCP (the direct handshake,
 * direct.c) has an inbox of its own besides: every message there is a
 * direct offer for that listener, so it needs no stash and no count.
 *
 * Client side: a few connected sockets to the inboxes recently used, so an
 * offer costs one sendmsg() and no path lookup.  Each such link is
 * numbered for the life of the process; the number is the key its offers'
 * regions are reused under (peerid.h): a connected datagram socket reaches
 * the one inbox it was connected to, whatever pid the registry names.
 */
#include "inbox.h"

#include "config.h"
#include "conn.h"
#include "io.h"
#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define STASH_MAX   64      /* offers read ahead of their connection */
#define DRAIN_MAX   64      /* offers read per accept, at most */
#define LINKS_MAX   8       /* inboxes a client keeps a socket to */
#define OFFER_SPIN_NS 200000LL  /* a server asleep in accept() takes this long to wake */
#define DIRECT_MAX  16      /* listeners taking connections without TCP, per process */

/* ---- the server's inbox ------------------------------------------------- */

struct pending {
	union clc_msg m;
	int fds[OFFER_FDS];
	long at_ms;
};

static pthread_mutex_t inbox_lock = PTHREAD_MUTEX_INITIALIZER;
static int inbox_sock = -1;
static pid_t inbox_owner;           /* a fork child does not own its parent's */
static uint64_t inbox_ident;
static struct pending stash[STASH_MAX];
static int stash_n;
static uint64_t empty_at;           /* offers sent when the inbox was last found empty */
static int empty_at_known;

struct direct_inbox {
	int lfd;                    /* the listener it serves */
	int sock;                   /* -1: a free entry */
	uint64_t id;
	struct ep addr;             /* the listener's address and namespace */
	uint64_t netns;
};
static struct direct_inbox directs[DIRECT_MAX];

static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;

void inbox_init(void)
{
	for (int i = 0; i < DIRECT_MAX; i++)
		directs[i].sock = -1;
}

/* Held across fork() (hs_fork_lock): inbox_lock before links_lock, as they nest. */
void inbox_fork_lock(void)
{
	pthread_mutex_lock(&inbox_lock);
	pthread_mutex_lock(&links_lock);
}

void inbox_fork_unlock(void)
{
	pthread_mutex_unlock(&links_lock);
	pthread_mutex_unlock(&inbox_lock);
}

static void stash_drop(int i)
{
	sys_close_all(stash[i].fds, OFFER_FDS);
	stash[i] = stash[--stash_n];
}

/* Drop what waited longer than its client would: it has given up.  Lock held. */
static void stash_drop_stale(void)
{
	long stale;

	if (!stash_n)
		return;         /* the usual case: no clock read */
	stale = mono_now_ms() - 2L * cfg.handshake_ms;
	for (int i = stash_n - 1; i >= 0; i--)
		if (stash[i].at_ms < stale)
			stash_drop(i);
}

/*
 * A fork child holds copies of its parent's inbox and stash: close them
 * (the parent's stay open) and start without an inbox.  Lock held.
 */
static void forget_parents_inbox(void)
{
	if (inbox_owner == sys_getpid())
		return;
	if (inbox_sock >= 0)
		sys_close(inbox_sock);
	while (stash_n)
		stash_drop(stash_n - 1);
	for (int i = 0; i < DIRECT_MAX; i++)
		if (directs[i].sock >= 0) {
			sys_close(directs[i].sock);
			directs[i].sock = -1;
		}
	inbox_sock = -1;
	inbox_ident = 0;
	empty_at_known = 0;
	inbox_owner = sys_getpid();
}

static void inbox_name(char *out, size_t len, pid_t pid, uint64_t id)
{
	snprintf(out, len, "%d.%016llx", (int)pid, (unsigned long long)id);
}

/* Bind a fresh inbox of this process: its socket (hidden) and id, or -1. */
static int inbox_bind(uint64_t *id)
{
	char name[48];
	int s;

	if (registry_fd < 0)
		return -1;
	*id = registry_random64() | 1;          /* 0 names no inbox */
	inbox_name(name, sizeof(name), sys_getpid(), *id);
	s = registry_inbox_bind(registry_fd, name);
	return s < 0 ? -1 : io_keep_fd(s);
}

uint64_t inbox_id(void)
{
	uint64_t id;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	if (inbox_sock < 0 && (inbox_sock = inbox_bind(&id)) >= 0)
		inbox_ident = id;
	id = inbox_ident;
	pthread_mutex_unlock(&inbox_lock);
	return id;
}

/* ---- a listener's direct inbox ------------------------------------------ */

/* The entry serving @lfd, or a free one if @lfd is -1; NULL if none.  Lock held. */
static struct direct_inbox *direct_find(int lfd)
{
	for (int i = 0; i < DIRECT_MAX; i++)
		if (lfd < 0 ? directs[i].sock < 0 : directs[i].sock >= 0 && directs[i].lfd == lfd)
			return &directs[i];
	return NULL;
}

uint64_t inbox_direct_open(int lfd, const struct ep *addr, uint64_t netns)
{
	struct direct_inbox *d;
	uint64_t id = 0;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	if (!direct_find(lfd) && (d = direct_find(-1)) && (d->sock = inbox_bind(&id)) >= 0) {
		d->lfd = lfd;
		d->id = id;
		d->addr = *addr;
		d->netns = netns;
	} else {
		id = 0;
	}
	pthread_mutex_unlock(&inbox_lock);
	return id;
}

int inbox_direct_sock(int lfd, struct ep *addr, uint64_t *netns)
{
	struct direct_inbox *d;
	int s = -1;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	if ((d = direct_find(lfd))) {
		s = d->sock;
		*addr = d->addr;
		*netns = d->netns;
	}
	pthread_mutex_unlock(&inbox_lock);
	return s;
}

void inbox_direct_close(int lfd, void (*refuse)(const union clc_msg *m, int fds[OFFER_FDS]))
{
	struct direct_inbox *d, gone = { .sock = -1 };
	union clc_msg m;
	int fds[OFFER_FDS];
	char name[48];

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	if ((d = direct_find(lfd))) {
		gone = *d;
		d->sock = -1;
	}
	pthread_mutex_unlock(&inbox_lock);
	if (gone.sock < 0)
		return;
	/* no client sends here any more once the name is gone; answer the rest */
	inbox_name(name, sizeof(name), sys_getpid(), gone.id);
	registry_inbox_remove(registry_fd, name);
	for (int n = 0; n < DRAIN_MAX; n++) {
		if (clc_recv(gone.sock, CLC_DIRECT, 0, &m, fds, OFFER_FDS) == 0)
			refuse(&m, fds);
		else if (errno != EPROTO)
			break;
	}
	sys_close(gone.sock);
}

/* Is @p the client end of the connection we accepted as @local <- @peer? */
static int pending_matches(const struct pending *p, const struct ep *local, const struct ep *peer)
{
	struct ep cl, cp;

	return ep_of_socket(p->fds[OFFER_FD_TCP], 0, &cl) == 0 &&
	       ep_of_socket(p->fds[OFFER_FD_TCP], 1, &cp) == 0 &&
	       ep_equal(&cl, peer) && ep_equal(&cp, local);
}

static void take(int i, union clc_msg *m, int fds[OFFER_FDS])
{
	*m = stash[i].m;
	memcpy(fds, stash[i].fds, sizeof(stash[i].fds));
	stash[i] = stash[--stash_n];
}

/*
 * Read one offer from the inbox into the stash: its index; -1 for a message
 * that is not an offer (dropped); -2 if the inbox is empty or failed.
 */
static int drain_one(void)
{
	struct pending p;

	if (clc_recv(inbox_sock, CLC_OFFER, 0, &p.m, p.fds, OFFER_FDS) < 0)
		return errno == EPROTO ? -1 : -2;
	p.at_ms = mono_now_ms();
	if (stash_n == STASH_MAX) {
		int oldest = 0;         /* it has the least chance of coming */
		for (int i = 1; i < stash_n; i++)
			if (stash[i].at_ms < stash[oldest].at_ms)
				oldest = i;
		stash_drop(oldest);
	}
	stash[stash_n] = p;
	return stash_n++;
}

/*
 * Whether no offer was sent to any inbox since ours was last found empty
 * (the registry's count has not moved); the count read, and whether there
 * is one, go to @sent and @counted.  Lock held.
 */
static int still_empty(uint64_t *sent, int *counted)
{
	*sent = 0;
	*counted = registry_offers_sent(registry_fd, sent) == 0;
	return *counted && empty_at_known && *sent == empty_at;
}

/*
 * Read the inbox until the offer for @local <- @peer comes, or the inbox is
 * empty (remembering the count of offers sent at that moment).  Lock held.
 */
static int drain_for(const struct ep *local, const struct ep *peer)
{
	uint64_t sent;
	int counted;

	if (still_empty(&sent, &counted))
		return -1;
	for (int n = 0; n < DRAIN_MAX; n++) {
		int i = drain_one();
		if (i == -2) {
			empty_at = sent;
			empty_at_known = counted;
			return -1;
		}
		if (i >= 0 && pending_matches(&stash[i], local, peer))
			return i;
	}
	return -1;
}

int inbox_may_hold_offer(void)
{
	uint64_t sent;
	int counted, may;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	may = inbox_sock >= 0 && (stash_n > 0 || !still_empty(&sent, &counted));
	pthread_mutex_unlock(&inbox_lock);
	return may;
}

int inbox_take(const struct ep *local, const struct ep *peer, union clc_msg *m,
               int fds[OFFER_FDS])
{
	int found = -1;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	if (inbox_sock < 0) {
		pthread_mutex_unlock(&inbox_lock);
		return -1;
	}
	stash_drop_stale();
	for (int i = 0; i < stash_n && found < 0; i++)
		if (pending_matches(&stash[i], local, peer))
			found = i;
	if (found < 0)
		found = drain_for(local, peer);
	if (found >= 0)
		take(found, m, fds);
	pthread_mutex_unlock(&inbox_lock);
	return found >= 0 ? 0 : -1;
}

int inbox_offer_decide(struct ring_hdr *up, uint32_t state)
{
	uint32_t w = atomic_load_explicit(&up->offer, memory_order_acquire);

	for (;;) {
		if (w != OFFER_OPEN && w != OFFER_OPEN_SLEEP && w != OFFER_OPEN_READING)
			return -1;
		if (atomic_compare_exchange_weak_explicit(&up->offer, &w, state,
		                                          memory_order_acq_rel,
		                                          memory_order_acquire))
			break;
	}
	if (w == OFFER_OPEN_SLEEP)
		sys_futex_wake(&up->offer);
	else if (w == OFFER_OPEN_READING && state != OFFER_TAKEN)
		bell_wake_word(&up->wake_seq);  /* nothing else will wake that read */
	return 0;
}

/* ---- the client's side -------------------------------------------------- */

struct link {
	char name[48];
	int sock;               /* connected to i/<name>, or -1 */
	uid_t owner;
	peerid key;             /* PEERID_LINK: never the same for two links of a process */
};

static struct link links[LINKS_MAX];
static unsigned links_next;
static uint64_t links_made;

static void link_drop(struct link *l)
{
	if (l->sock >= 0)
		sys_close(l->sock);
	memset(l, 0, sizeof(*l));
	l->sock = -1;
}

/* The socket to inbox @name, connecting it if needed (lock held). */
static struct link *link_get(const char *name)
{
	struct link *l;
	uid_t owner;
	int s;

	for (int i = 0; i < LINKS_MAX; i++)
		if (links[i].name[0] && !strcmp(links[i].name, name))
			return &links[i];
	s = registry_inbox_connect(registry_fd, name, &owner);
	if (s < 0)
		return NULL;
	l = &links[links_next++ % LINKS_MAX];
	if (l->name[0])
		link_drop(l);
	snprintf(l->name, sizeof(l->name), "%s", name);
	l->sock = io_keep_fd(s);
	l->owner = owner;
	l->key = peerid_make(PEERID_LINK, ++links_made);
	return l;
}

/*
 * The link to inbox @id of @li's process, if our TCP socket may go there:
 * only to a user we may attach to, and who wrote the entry that names it -
 * registry_listener_find believed that user, not whoever took the name
 * (lock held).
 */
static struct link *link_to(const struct listener_info *li, uint64_t id)
{
	struct link *l;
	char name[48];

	inbox_name(name, sizeof(name), li->pid, id);
	l = link_get(name);
	return l && l->owner == li->owner && config_uid_allowed(&cfg, l->owner) ? l : NULL;
}

peerid inbox_link(const struct listener_info *li, uint64_t id)
{
	struct link *l;
	peerid key;

	pthread_mutex_lock(&links_lock);
	l = link_to(li, id);
	key = l ? l->key : PEERID_NONE;
	pthread_mutex_unlock(&links_lock);
	return key;
}

int inbox_send(const struct listener_info *li, uint64_t id, peerid via, const union clc_msg *m,
               const int fds[OFFER_FDS])
{
	struct clc_out o;
	struct link *l;
	uint64_t sent;
	int rc = -1;

	/* an offer nobody can count could be skipped by its server: send none */
	if (registry_offers_sent(registry_fd, &sent) < 0)
		return -1;
	pthread_mutex_lock(&links_lock);
	l = link_to(li, id);
	if (l && l->key == via) {
		if (sys_sendmsg(l->sock, clc_prepare(&o, m, fds, OFFER_FDS),
		                MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)m->hdr.length) {
			if (m->hdr.type == CLC_OFFER)   /* a direct inbox is read without */
				registry_offer_count(registry_fd);      /* queued: now it may count */
			rc = 0;
		} else if (errno != EAGAIN)
			link_drop(l);   /* the inbox is gone */
	}
	pthread_mutex_unlock(&links_lock);
	return rc;
}

static int decided(uint32_t w)
{
	return w == OFFER_TAKEN || OFFER_STATE(w) == OFFER_DECLINED;
}

uint32_t inbox_offer_withdraw(struct ring_hdr *up)
{
	uint32_t w = atomic_load_explicit(&up->offer, memory_order_acquire);

	/* bounded: only a hostile server keeps changing the word under us */
	for (int tries = 0; tries < 1000 && !decided(w); tries++)
		if (atomic_compare_exchange_weak_explicit(&up->offer, &w, OFFER_WITHDRAWN,
		                                          memory_order_acq_rel,
		                                          memory_order_acquire))
			return OFFER_WITHDRAWN;
	return decided(w) ? w : OFFER_WITHDRAWN;
}

/* The spin all waits start with; 1 with *@w set if the server decided meanwhile. */
static int offer_spin(struct ring_hdr *up, long deadline_ms, uint32_t *w)
{
	return deadline_ms > mono_now_ms() && spin_for_word(&up->offer, OFFER_OPEN, OFFER_SPIN_NS) &&
	       decided(*w = atomic_load_explicit(&up->offer, memory_order_acquire));
}

uint32_t inbox_offer_wait(struct ring_hdr *up, long deadline_ms)
{
	uint32_t w = OFFER_OPEN;

	if (offer_spin(up, deadline_ms, &w))
		return w;
	w = OFFER_OPEN;
	if (!atomic_compare_exchange_strong(&up->offer, &w, OFFER_OPEN_SLEEP) && decided(w))
		return w;
	for (;;) {
		long left = deadline_ms - mono_now_ms();
		struct timespec t = { .tv_sec = left / 1000, .tv_nsec = (left % 1000) * 1000000L };

		w = atomic_load_explicit(&up->offer, memory_order_acquire);
		if (decided(w))
			return w;
		if (left <= 0)
			return inbox_offer_withdraw(up);
		if (w == OFFER_OPEN_SLEEP) {
			sys_futex_wait(&up->offer, OFFER_OPEN_SLEEP, &t);
		} else {
			/* neither ours nor a decision (a hostile server): look every ms */
			struct timespec ms = { .tv_nsec = 1000000L };
			nanosleep(&ms, NULL);
		}
	}
}

uint32_t inbox_offer_wait_reading(struct ring_hdr *up, uint32_t take, long deadline_ms,
                            int *interrupted)
{
	uint32_t w = OFFER_OPEN;

	*interrupted = 0;
	if (offer_spin(up, deadline_ms, &w))
		return w;
	/* the promise first: a server that sees READING sees it too (rx.c) */
	atomic_store_explicit(&up->futex_take, take ? take : 1, memory_order_seq_cst);
	w = OFFER_OPEN;
	if (!atomic_compare_exchange_strong(&up->offer, &w, OFFER_OPEN_READING)) {
		atomic_store_explicit(&up->futex_take, 0, memory_order_seq_cst);
		return decided(w) ? w : inbox_offer_wait(up, deadline_ms);
	}
	for (;;) {
		uint32_t seq = atomic_load_explicit(&up->wake_seq, memory_order_seq_cst);
		long left = deadline_ms - mono_now_ms();
		struct timespec t = { .tv_sec = left / 1000, .tv_nsec = (left % 1000) * 1000000L };

		w = atomic_load_explicit(&up->offer, memory_order_acquire);
		if (decided(w) || left <= 0 || w != OFFER_OPEN_READING)
			break;
		if (sys_futex_wait(&up->wake_seq, seq, &t) < 0 && errno == EINTR &&
		    !bell_signals_restart()) {
			/* the read must fail with EINTR: wait for the decision alone */
			*interrupted = 1;
			atomic_compare_exchange_strong(&up->offer, &w, OFFER_OPEN);
			break;
		}
	}
	atomic_store_explicit(&up->futex_take, 0, memory_order_seq_cst);
	if (decided(w) || *interrupted)
		return decided(w) ? w : inbox_offer_wait(up, deadline_ms);
	/* the deadline, or a word that is neither ours nor a decision (hostile) */
	return w == OFFER_OPEN_READING ? inbox_offer_withdraw(up) : inbox_offer_wait(up, deadline_ms);
}
