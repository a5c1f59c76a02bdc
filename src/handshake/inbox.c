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
 * A shared inbox: the fork children that accept on a listener that defers
 * accept (apache2's children, its default AcceptFilter) read their parent's
 * inbox, which their entries name too, so a client sees one inbox there and
 * sends its offer with its first bytes over TCP (listener.c).  The kernel
 * wakes whichever child it likes, so an offer a reader takes out and finds
 * not its own is parked where its acceptor will look, instead of in a
 * stash another process cannot see: one of PARKS datagram socket pairs
 * made with the inbox (at the first fork) and inherited with it, chosen
 * by the client's end of the connection, so an accept looks through the
 * offers of its own park only - with one park for all, every accept read
 * every offer still waiting for its connection (apache2 under ab -c 60:
 * 24 offers moved per accept, 8x slower than TCP).  Not the inbox itself:
 * the kernel queues at most net.unix.max_dgram_qlen (10) datagrams from
 * strangers there, while between the two ends of a pair only the buffer
 * counts.  An accept reads the inbox, parking the offers of other parks
 * as it goes, then the park of offers read before their client connected
 * (PARK_UNSEEN: a server that forked once shares its inbox for every
 * listener, and there a client offers before its SYN), then its park, each
 * offer once, and parks the rest when the pass ends.  A shared page, inherited by fork, names the
 * readers holding offers out of the queues at any moment, and which park
 * they hold for: a reader that finds its queues empty while a live one
 * holds some of its park's waits for it (bounded), since its own may be
 * among them.  An offer whose client has decided is dropped, not parked.
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
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define STASH_MAX   64      /* offers read ahead of their connection */
#define DRAIN_MAX   64      /* offers read per accept, at most */
#define LINKS_MAX   8       /* inboxes a client keeps a socket to */
#define OFFER_SPIN_NS 200000LL  /* a server asleep in accept() takes this long to wake */
#define DIRECT_MAX  16      /* listeners taking connections without TCP, per process */
#define SHARED_WAIT_MS 20   /* for offers other readers of a shared inbox hold out */
#define LINK_ROOM_MS 5      /* for room in an inbox's queue */

/* ---- the server's inbox ------------------------------------------------- */

struct pending {
	union clc_msg m;
	int fds[OFFER_FDS];
	long at_ms;
	struct ep client, server;   /* the TCP connection's ends, as its socket says */
	int ends_known;
};

/*
 * What the processes reading one inbox share (MAP_SHARED, inherited by
 * fork); an inbox that has it is shared: a fork child may read it.  A
 * reader that takes offers out of the queues writes its pid in a free slot
 * first, with the park whose offers it may hold (HOLD_ANY while it reads
 * the inbox), and clears it once it has parked what is not its own; a
 * reader killed in between leaves its pid, which the next reader that
 * looks finds dead and clears (shared_others_hold), so it is never waited
 * for.
 */
#define HOLDERS 64
#define PARKS 16                /* a shared inbox's parks, by the client's end */
#define PARK_UNSEEN PARKS       /* and one for offers whose client was not connected yet */
#define PARK_PAIRS (PARKS + 1)  /* 34 descriptors in each reader */
#define HOLD_ANY PARK_PAIRS
#define HOLDER(pid, park) ((int64_t)(park) << 32 | (uint32_t)(pid))
#define HOLDER_PID(h) ((pid_t)(uint32_t)(h))
#define HOLDER_PARK(h) ((int)((h) >> 32))
struct inbox_share {
	_Atomic int64_t holder[HOLDERS];
};

struct inbox {
	int sock;                   /* -1: none */
	int parks;                  /* shared: PARK_PAIRS socket pairs in park */
	int park[PARK_PAIRS][2];    /* offers read and not ours, by their client's end */
	uint64_t id;
	pid_t pid;                  /* the pid in its name: its maker's */
	struct inbox_share *share;
	uint64_t empty_at;          /* offers sent when it was last found empty */
	int empty_at_known;
	/* shared: offers sent when a pass for park i found its queues empty
	 * (a pass reads its own park only: one park found empty says nothing
	 * of the others) */
	uint64_t park_empty_at[PARK_PAIRS];
	uint32_t park_empty_known;  /* bit i: park_empty_at[i] holds */
};
#define INBOX_NONE ((struct inbox){ .sock = -1 })

static pthread_mutex_t inbox_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t inbox_owner;           /* a fork child does not own its parent's */
static struct inbox own = INBOX_NONE;
static struct inbox inherited = INBOX_NONE; /* a parent's, read by its fork child */
static struct pending stash[STASH_MAX];
static int stash_n;

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

static void inbox_close(struct inbox *ib)
{
	if (ib->sock >= 0)
		sys_close(ib->sock);
	for (int i = 0; i < ib->parks; i++)
		sys_close_all(ib->park[i], 2);
	if (ib->share)
		munmap(ib->share, sizeof(*ib->share));
	*ib = INBOX_NONE;
}

/*
 * A fork child holds copies of its parent's inboxes and stash.  The
 * parent's own inbox (or, failing one, the inbox it read as a child itself)
 * stays open here as the inherited one, for the listeners that defer accept
 * (listener.c names it in their entries); the rest is closed (the parent's
 * stay open) and the child starts without an inbox of its own.  Lock held.
 */
static void forget_parents_inbox(void)
{
	if (inbox_owner == sys_getpid())
		return;
	if (own.sock >= 0 && own.share) {
		inbox_close(&inherited);
		inherited = own;
		inherited.empty_at_known = 0;
		inherited.park_empty_known = 0;
		own = INBOX_NONE;
	}
	inbox_close(&own);
	while (stash_n)
		stash_drop(stash_n - 1);
	for (int i = 0; i < DIRECT_MAX; i++)
		if (directs[i].sock >= 0) {
			sys_close(directs[i].sock);
			directs[i].sock = -1;
		}
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

/* This process's own inbox, bound.  Lock held. */
static void own_open(void)
{
	if ((own.sock = inbox_bind(&own.id)) < 0)
		return;
	own.pid = sys_getpid();
	own.empty_at_known = 0;
}

/*
 * What sharing our inbox needs, made the first time we fork with one: the
 * parks and the shared page (descriptors a process that never forks does
 * not spend).  Without them it stays ours alone.  Lock held.
 */
static void own_share(void)
{
	struct inbox_share *sh;

	if (own.sock < 0 || own.share)
		return;
	for (own.parks = 0; own.parks < PARK_PAIRS; own.parks++) {
		int *park = own.park[own.parks];
		if (sys_socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, park) < 0)
			break;
		park[0] = io_keep_fd(park[0]);
		park[1] = io_keep_fd(park[1]);
	}
	sh = own.parks < PARK_PAIRS ? MAP_FAILED :
	     mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		while (own.parks > 0)
			sys_close_all(own.park[--own.parks], 2);
		return;
	}
	own.share = sh;
}

uint64_t inbox_id(void)
{
	uint64_t id;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	if (own.sock < 0)
		own_open();
	id = own.sock >= 0 ? own.id : 0;
	pthread_mutex_unlock(&inbox_lock);
	return id;
}

/* Lock held: by us, or since hs_fork_lock in a fork child's handler. */
static uint64_t inherited_id(int *pid)
{
	forget_parents_inbox();
	*pid = inherited.pid;
	return inherited.sock >= 0 ? inherited.id : 0;
}

uint64_t inbox_inherited(int *pid)
{
	uint64_t id;

	pthread_mutex_lock(&inbox_lock);
	id = inherited_id(pid);
	pthread_mutex_unlock(&inbox_lock);
	return id;
}

uint64_t inbox_inherited_forking(int *pid)
{
	return inherited_id(pid);
}

void inbox_inherited_drop_forking(void)
{
	forget_parents_inbox();
	inbox_close(&inherited);
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

/*
 * Note the ends of @p's TCP connection, as its socket (the proof) says.
 * The peer first: a client offers before its SYN, so its connect() may run
 * between the two questions, and asked the other way round a socket still
 * unbound (port 0) then connected read as a connection from port 0 - an
 * offer parked where no accept ever looks, its client's FIN held with it
 * (the socket stays open while the offer holds it).  The kernel names a
 * peer only once the connection is up, and binds the local end before.
 */
static void pending_read_ends(struct pending *p)
{
	p->ends_known = ep_of_socket(p->fds[OFFER_FD_TCP], 1, &p->server) == 0 &&
	                ep_of_socket(p->fds[OFFER_FD_TCP], 0, &p->client) == 0 &&
	                p->client.port != 0;
}

/*
 * Is @p the client end of the connection we accepted as @local <- @peer?
 * A client offers before its SYN (except to a listener that defers
 * accept), so an offer read ahead may name no connection yet: its ends are
 * asked again until it does.
 */
static int pending_matches(struct pending *p, const struct ep *local, const struct ep *peer)
{
	if (!p->ends_known)
		pending_read_ends(p);
	return p->ends_known && ep_equal(&p->client, peer) && ep_equal(&p->server, local);
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

	if (clc_recv(own.sock, CLC_OFFER, 0, &p.m, p.fds, OFFER_FDS) < 0)
		return errno == EPROTO ? -1 : -2;
	p.at_ms = mono_now_ms();
	pending_read_ends(&p);
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
 * Whether no offer was sent to any inbox since @ib was last found empty
 * (the registry's count has not moved; an offer parked counts as sent);
 * the count read, and whether there is one, go to @sent and @counted.
 */
static int still_empty(const struct inbox *ib, uint64_t *sent, int *counted)
{
	*sent = 0;
	*counted = registry_offers_sent(registry_fd, sent) == 0;
	return *counted && ib->empty_at_known && *sent == ib->empty_at;
}

static void found_empty(struct inbox *ib, uint64_t sent, int counted)
{
	ib->empty_at = sent;
	ib->empty_at_known = counted;
}

/*
 * Read the inbox until the offer for @local <- @peer comes, or the inbox is
 * empty (remembering the count of offers sent at that moment).  Lock held.
 */
static int drain_for(const struct ep *local, const struct ep *peer)
{
	uint64_t sent;
	int counted;

	if (still_empty(&own, &sent, &counted))
		return -1;
	for (int n = 0; n < DRAIN_MAX; n++) {
		int i = drain_one();
		if (i == -2) {
			found_empty(&own, sent, counted);
			return -1;
		}
		if (i >= 0 && pending_matches(&stash[i], local, peer))
			return i;
	}
	return -1;
}

/* ---- a shared inbox ------------------------------------------------------ */

static int is_shared(const struct inbox *ib)
{
	return ib->sock >= 0 && ib->share;
}

/* The park of the connection whose client end is @client. */
static int park_of(const struct ep *client)
{
	/* ephemeral ports come in sequence: consecutive connections spread */
	return (client->port ^ client->ip[15] ^ client->ip[14]) % PARKS;
}

/* The park of @p: PARK_UNSEEN while its client is not connected. */
static int pending_park(struct pending *p)
{
	if (!p->ends_known)
		pending_read_ends(p);
	return p->ends_known ? park_of(&p->client) : PARK_UNSEEN;
}

/*
 * Has the client of @p decided already?  It closes its end of the pair at
 * its decision (or the kernel does, at its exit), and its offer can only
 * be taken while that end is open: the pair hangs up.  Such an offer is
 * never taken, and parked it would be read at every accept of its park
 * until it went stale.
 */
static int pending_client_gone(const struct pending *p)
{
	struct pollfd pf = { .fd = p->fds[OFFER_FD_PAIR] };

	return sys_poll(&pf, 1, 0) == 1 && (pf.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/*
 * Park @p for the process whose connection it is; or drop it once its
 * client decided (pending_client_gone), or once it has gone round longer
 * than its client waits (the first reader to park it notes when, in the
 * nonce, which an offer does not use; a time from the future is a
 * client's lie: dropped).  Closes its descriptors either way.  The caller counts the offers parked as sent
 * (registry_offer_count), once: readers that found the queues empty look
 * again.
 */
static void shared_park(struct inbox *ib, struct pending *p)
{
	long now = mono_now_ms();
	uint64_t first = p->m.hdr.nonce;
	int fresh = !first || (first <= (uint64_t)now + 1 &&
	                       now + 1 - (long)first <= 2L * cfg.handshake_ms);
	struct clc_out o;

	if (!first)
		p->m.hdr.nonce = (uint64_t)now + 1;
	if (fresh && !pending_client_gone(p))
		sys_sendmsg(ib->park[pending_park(p)][1],
		            clc_prepare(&o, &p->m, p->fds, OFFER_FDS), MSG_NOSIGNAL | MSG_DONTWAIT);
	sys_close_all(p->fds, OFFER_FDS);
}

/* Our pid in a free slot (its index), holding for @park; or -1: all taken,
 * we go uncounted. */
static int shared_hold(struct inbox *ib, int park)
{
	int64_t me = HOLDER(sys_getpid(), park);

	for (int i = 0; i < HOLDERS; i++) {
		int64_t free_slot = 0;
		if (atomic_compare_exchange_strong(&ib->share->holder[i], &free_slot, me))
			return i;
	}
	return -1;
}

/* From reading the inbox on, we hold offers of @park only. */
static void shared_hold_park(struct inbox *ib, int slot, int park)
{
	if (slot >= 0)
		atomic_store(&ib->share->holder[slot], HOLDER(sys_getpid(), park));
}

static void shared_unhold(struct inbox *ib, int slot)
{
	if (slot >= 0)
		atomic_store(&ib->share->holder[slot], 0);
}

/*
 * Does a live reader other than us hold offers out that may be of @park?
 * Dead ones are cleared.
 */
static int shared_others_hold(struct inbox *ib, int park)
{
	pid_t me = sys_getpid();

	for (int i = 0; i < HOLDERS; i++) {
		int64_t h = atomic_load(&ib->share->holder[i]);
		pid_t pid = HOLDER_PID(h);
		if (h == 0 || pid == me || (HOLDER_PARK(h) != park && HOLDER_PARK(h) != HOLD_ANY))
			continue;
		if (pid > 0 && kill(pid, 0) < 0 && errno == ESRCH)
			atomic_compare_exchange_strong(&ib->share->holder[i], &h, 0);
		else
			return 1;
	}
	return 0;
}

/* Is any slot taken (no system call: for the look before an accept's)? */
static int shared_any_hold(const struct inbox *ib)
{
	for (int i = 0; i < HOLDERS; i++)
		if (atomic_load_explicit(&ib->share->holder[i], memory_order_relaxed))
			return 1;
	return 0;
}

/*
 * Read one offer from @q into @p (its ends noted): 1; 0 once @q is empty
 * or @reads reaches DRAIN_MAX.  What is not an offer is dropped.
 */
static int shared_read(int q, struct pending *p, int *reads)
{
	while (*reads < DRAIN_MAX) {
		if (clc_recv(q, CLC_OFFER, 0, &p->m, p->fds, OFFER_FDS) == 0) {
			++*reads;
			pending_read_ends(p);
			return 1;
		}
		if (errno != EPROTO)
			return 0;       /* empty: not counted, the wait is bounded by time */
		++*reads;       /* not an offer: dropped, and counted: a flood ends */
	}
	return 0;
}

/*
 * Read @q for the connection @local <- @peer: 1 with its offer in @out.
 * An offer of another park than @park is parked at once (*@parked set);
 * the others are kept in @keep (*@nkeep), to be parked after the pass, and
 * *@unseen counts those whose client is not connected yet (any park's).
 */
static int shared_read_queue(struct inbox *ib, int q, int park, const struct ep *local,
                             const struct ep *peer, struct pending *out, struct pending *keep,
                             int *nkeep, int *reads, int *parked, int *unseen)
{
	while (shared_read(q, &keep[*nkeep], reads)) {
		struct pending *p = &keep[*nkeep];
		int its = pending_park(p);

		if (pending_matches(p, local, peer)) {
			*out = *p;
			return 1;
		}
		if (its != park && its != PARK_UNSEEN) {
			shared_park(ib, p);
			*parked = 1;
			continue;
		}
		*unseen += its == PARK_UNSEEN;
		++*nkeep;               /* read again below otherwise */
	}
	return 0;
}

/*
 * One pass for the connection @local <- @peer (park @park): the inbox and
 * the park of offers not connected when read, while we may hold offers of
 * any park; then @park, each offer read once.  1 with the offer in @out;
 * what is kept (shared_read_queue) is parked after the pass; 0 once the
 * queues are empty, or when @reads reaches DRAIN_MAX.
 */
static int shared_pass(struct inbox *ib, int slot, int park, const struct ep *local,
                       const struct ep *peer, struct pending *out, struct pending *keep,
                       int *nkeep, int *reads)
{
	int parked = 0, unseen = 0;
	int found = shared_read_queue(ib, ib->sock, park, local, peer, out, keep, nkeep, reads,
	                              &parked, &unseen) ||
	            shared_read_queue(ib, ib->park[PARK_UNSEEN][0], park, local, peer, out, keep,
	                              nkeep, reads, &parked, &unseen);

	if (!found && !unseen)
		shared_hold_park(ib, slot, park);   /* we hold offers of @park only now */
	if (!found)
		found = shared_read_queue(ib, ib->park[park][0], park, local, peer, out, keep,
		                          nkeep, reads, &parked, &unseen);
	if (parked)
		registry_offer_count(registry_fd);
	return found;
}

/*
 * Both were empty.  Look again while another reader holds offers that may
 * be of @park (ours may be among them; it parks what is not its own), for
 * at most SHARED_WAIT_MS; once nobody holds any, one last look: an offer
 * parked between our read and now is there (parked before its holder
 * clears its slot).
 */
static int shared_look_again(struct inbox *ib, int park, long *until, int *last)
{
	if (!shared_others_hold(ib, park)) {
		*last = !*last;
		return *last;
	}
	*last = 0;
	if (!*until)
		*until = mono_now_ms() + SHARED_WAIT_MS;
	else if (mono_now_ms() >= *until)
		return 0;
	sched_yield();
	return 1;
}

/*
 * Whether no offer was sent or parked since a pass for @park found the
 * inbox, the park of offers not connected yet and @park empty (the count
 * read goes to @sent and @counted, as still_empty's).
 */
static int shared_still_empty(const struct inbox *ib, int park, uint64_t *sent, int *counted)
{
	*sent = 0;
	*counted = registry_offers_sent(registry_fd, sent) == 0;
	return *counted && (ib->park_empty_known & 1u << park) && *sent == ib->park_empty_at[park];
}

static void shared_found_empty(struct inbox *ib, int park, uint64_t sent, int counted)
{
	ib->park_empty_at[park] = sent;
	if (counted)
		ib->park_empty_known |= 1u << park;
	else
		ib->park_empty_known &= ~(1u << park);
}

/* The offer for @local <- @peer from shared inbox @ib: 0, or -1 if none. */
static int shared_take(struct inbox *ib, const struct ep *local, const struct ep *peer,
                       union clc_msg *m, int fds[OFFER_FDS])
{
	struct pending keep[DRAIN_MAX], mine;
	int park = park_of(peer);
	long until = 0;
	uint64_t sent;
	int counted, last = 0, reads = 0;

	if (shared_still_empty(ib, park, &sent, &counted) && !shared_any_hold(ib))
		return -1;
	for (;;) {
		int nkeep = 0, slot = shared_hold(ib, HOLD_ANY);
		int found = shared_pass(ib, slot, park, local, peer, &mine, keep, &nkeep, &reads);

		for (int i = 0; i < nkeep; i++)
			shared_park(ib, &keep[i]);
		if (nkeep)
			registry_offer_count(registry_fd);
		shared_unhold(ib, slot);
		if (found) {
			*m = mine.m;
			memcpy(fds, mine.fds, sizeof(mine.fds));
			return 0;
		}
		if (reads >= DRAIN_MAX)
			return -1;
		shared_found_empty(ib, park, sent, counted);
		if (!shared_look_again(ib, park, &until, &last))
			return -1;
	}
}

void inbox_fork_prepare(void)
{
	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	/* a child may read our inbox from now on: what we read ahead is parked */
	own_share();
	if (own.share && stash_n) {
		while (stash_n)
			shared_park(&own, &stash[--stash_n]);
		registry_offer_count(registry_fd);
	}
	pthread_mutex_unlock(&inbox_lock);
}

/* ---- taking an offer ---------------------------------------------------- */

int inbox_may_hold_offer(void)
{
	uint64_t sent;
	int counted, may;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	may = (own.sock >= 0 && (stash_n > 0 || !still_empty(&own, &sent, &counted) ||
	                         (is_shared(&own) && shared_any_hold(&own)))) ||
	      (is_shared(&inherited) && (!still_empty(&inherited, &sent, &counted) ||
	                                  shared_any_hold(&inherited)));
	pthread_mutex_unlock(&inbox_lock);
	return may;
}

int inbox_take(const struct ep *local, const struct ep *peer, union clc_msg *m,
               int fds[OFFER_FDS])
{
	int found = -1, rc = -1;

	pthread_mutex_lock(&inbox_lock);
	forget_parents_inbox();
	stash_drop_stale();
	for (int i = 0; i < stash_n && found < 0; i++)
		if (pending_matches(&stash[i], local, peer))
			found = i;
	if (found < 0 && own.sock >= 0 && !is_shared(&own))
		found = drain_for(local, peer);
	if (found >= 0) {
		take(found, m, fds);
		rc = 0;
	} else if (is_shared(&own)) {
		rc = shared_take(&own, local, peer, m, fds);
	}
	if (rc < 0 && is_shared(&inherited))
		rc = shared_take(&inherited, local, peer, m, fds);
	pthread_mutex_unlock(&inbox_lock);
	return rc;
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

/*
 * Send on @l without blocking; an inbox whose queue is full (the kernel
 * takes net.unix.max_dgram_qlen datagrams from strangers, 10 by default:
 * a burst of connects) is waited for a little, as its server empties it
 * at its next accept.
 */
static ssize_t link_send(struct link *l, const struct msghdr *msg)
{
	ssize_t n = sys_sendmsg(l->sock, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	struct pollfd p = { .fd = l->sock, .events = POLLOUT };

	if (n < 0 && errno == EAGAIN && sys_poll(&p, 1, LINK_ROOM_MS) == 1)
		n = sys_sendmsg(l->sock, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	return n;
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
		if (link_send(l, clc_prepare(&o, m, fds, OFFER_FDS)) == (ssize_t)m->hdr.length) {
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

/* The end of this wait: @look_ms, if it comes before the deadline. */
static long wait_until(long deadline_ms, long look_ms)
{
	return look_ms && look_ms < deadline_ms ? look_ms : deadline_ms;
}

uint32_t inbox_offer_wait(struct ring_hdr *up, long deadline_ms, long look_ms)
{
	long until = wait_until(deadline_ms, look_ms);
	uint32_t w = OFFER_OPEN;

	if (offer_spin(up, until, &w))
		return w;
	w = OFFER_OPEN;
	if (!atomic_compare_exchange_strong(&up->offer, &w, OFFER_OPEN_SLEEP) && decided(w))
		return w;
	for (;;) {
		long left = until - mono_now_ms();
		struct timespec t = { .tv_sec = left / 1000, .tv_nsec = (left % 1000) * 1000000L };

		w = atomic_load_explicit(&up->offer, memory_order_acquire);
		if (decided(w))
			return w;
		if (left <= 0)
			return until == deadline_ms ? inbox_offer_withdraw(up) : OFFER_OPEN;
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
                                  long look_ms, int *interrupted)
{
	long until = wait_until(deadline_ms, look_ms);
	uint32_t w = OFFER_OPEN;

	*interrupted = 0;
	if (offer_spin(up, until, &w))
		return w;
	/* the promise first: a server that sees READING sees it too (rx.c) */
	atomic_store_explicit(&up->futex_take, take ? take : 1, memory_order_seq_cst);
	w = OFFER_OPEN;
	if (!atomic_compare_exchange_strong(&up->offer, &w, OFFER_OPEN_READING)) {
		atomic_store_explicit(&up->futex_take, 0, memory_order_seq_cst);
		return decided(w) ? w : inbox_offer_wait(up, deadline_ms, look_ms);
	}
	for (;;) {
		uint32_t seq = atomic_load_explicit(&up->wake_seq, memory_order_seq_cst);
		long left = until - mono_now_ms();
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
		return decided(w) ? w : inbox_offer_wait(up, deadline_ms, look_ms);
	/* a look before the deadline: the word as the next wait expects it */
	if (w == OFFER_OPEN_READING && until != deadline_ms)
		return atomic_compare_exchange_strong(&up->offer, &w, OFFER_OPEN) ? OFFER_OPEN :
		       decided(w) ? w : inbox_offer_wait(up, deadline_ms, look_ms);
	/* the deadline, or a word that is neither ours nor a decision (hostile) */
	return w == OFFER_OPEN_READING ? inbox_offer_withdraw(up) :
	       inbox_offer_wait(up, deadline_ms, look_ms);
}
