/*
 * client.c - the client's handshake, inside connect(): a rendezvous offer
 * through the listener's entry (TCP connect, ACCEPT at p/<tuple>, CONFIRM),
 * an offer to the listener process's inbox (inbox.h), a direct offer
 * without TCP, and a connection whose offer is still undecided when
 * connect() returns ("pending", decided at the next call that needs to
 * know: hs_resolve).  handshake.h has the protocol's outline.
 */
#include "hs_internal.h"

#include "io.h"
#include "iov.h"
#include "pairs.h"
#include "payoff.h"
#include "peerid.h"
#include "region.h"
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct client {
	int fd;                 /* the application's TCP socket */
	struct ep dst, src;
	uint64_t netns;
	struct listener_info listener;
	peerid via;             /* the inbox link an offer goes through (its region's key) */
	char key[96];
	int rendezvous;         /* our p/<key> socket, or -1 */
	int pair_ahead;         /* the offer's pair was made ahead: both ends hidden */
	int reuse_was_set;
	int bound_by_us;
};


/* Has this process ever made a pending connection (hs_fork_decide)? */
static _Atomic int pending_made;

/* Reasons not to try at all; R_NONE means go ahead. */
static int client_precheck(struct client *cl)
{
	if (registry_fd < 0)
		return R_NO_REGISTRY;
	if (registry_port_unlistened(registry_fd, cl->dst.port))         /* no system call */
		return registry_private_why() ? R_PRIVATE_REGISTRY : R_PEER_NO_SMCLO;
	cl->netns = proof_netns_cookie(cl->fd);
	registry_listener_find(registry_fd, &cl->dst, cl->netns, &cl->listener);
	switch (cl->listener.m) {
	case LM_NONE:      return registry_private_why() ? R_PRIVATE_REGISTRY : R_PEER_NO_SMCLO;
	case LM_UNVERIFIED: return cfg.allow_any_uid ? R_UNVERIFIED : R_DIFF_USER;
	case LM_ELSEWHERE: return R_NOT_THIS_HOST;
	case LM_DEFER:     return R_DEFER_ACCEPT;
	case LM_UNREACHABLE: return R_NO_REGISTRY;
	case LM_OTHER_NETNS:
		if (!cfg.cross_netns)
			return R_CROSS_NETNS_OFF;
		if (proof_dst_is_local(&cl->dst))
			return R_NOT_THIS_HOST;
		break;
	case LM_SAME_NETNS:
		/* an entry for 0.0.0.0 covers every address, a remote one too,
		 * where the kernel would not take the connection here */
		if (!ep_is_loopback(&cl->dst) && !proof_dst_is_local(&cl->dst))
			return R_NOT_THIS_HOST;
		break;
	}
	if (proof_io_uring_unseen())
		return R_IO_URING;
	if (fd_flags(cl->fd) & FDF_EPOLL_LOST)
		return R_EPOLL_EARLY;   /* a registration that cannot follow (shim/epoll_early.c) */
	/* a listener that defers accept is woken by the first bytes alone: they
	 * go over TCP with an offer to its one inbox, never decided before (an
	 * epoll set that holds the socket watches its doorbell from then on:
	 * shim/epoll_early.c) */
	if (cl->listener.defers && (!cl->listener.exclusive || !cfg.inbox || fd_budget_is_small()))
		return R_DEFER_ACCEPT;
	if (conn_count() >= cfg.max_conns)
		return R_MAX_BUFFERS;
	return R_NONE;
}

/*
 * The rendezvous is named by our source port, which must be known before the
 * SYN leaves, so bind to an ephemeral port.  SO_REUSEADDR lets the kernel
 * hand out ports whose old connections linger (as connect() itself would);
 * accelerated connections close their TCP socket with a reset, so they leave
 * no TIME_WAIT behind.
 */
static int client_bind(struct client *cl)
{
	struct sockaddr_storage ss;
	socklen_t l;
	int one = 1, family = AF_INET;

	if (ep_of_socket(cl->fd, 0, &cl->src) < 0)
		return -1;
	if (cl->src.port)
		return 0;        /* the application bound it itself */
	l = sizeof(cl->reuse_was_set);
	sys_getsockopt(cl->fd, SOL_SOCKET, SO_REUSEADDR, &cl->reuse_was_set, &l);
	sys_setsockopt(cl->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&ss, 0, sizeof(ss));
	l = sizeof(family);
	sys_getsockopt(cl->fd, SOL_SOCKET, SO_DOMAIN, &family, &l);
	ss.ss_family = (sa_family_t)family;
	l = ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	if (sys_bind(cl->fd, &ss, l) < 0 || ep_of_socket(cl->fd, 0, &cl->src) < 0)
		return -1;
	cl->bound_by_us = 1;
	return 0;
}

static void client_restore_reuse(struct client *cl)
{
	if (cl->bound_by_us && !cl->reuse_was_set) {
		int zero = 0;
		sys_setsockopt(cl->fd, SOL_SOCKET, SO_REUSEADDR, &zero, sizeof(zero));
	}
}

static int client_rendezvous_open(struct client *cl)
{
	int e;

	registry_rendezvous_key(cl->key, sizeof(cl->key), &cl->dst, cl->src.port);
	if (registry_rendezvous_count(registry_fd, 1) < 0)      /* before the SYN: servers look */
		return R_NO_REGISTRY;
	cl->rendezvous = registry_rendezvous_bind(registry_fd, cl->key);
	if (cl->rendezvous >= 0)
		return R_NONE;
	e = errno;
	registry_rendezvous_count(registry_fd, -1);
	return e == EADDRINUSE ? R_TUPLE_BUSY : R_NO_REGISTRY;
}

/* Anything still queued (a late ACCEPT) goes with the socket: see top of file. */
static void client_rendezvous_close(struct client *cl)
{
	if (cl->rendezvous < 0)
		return;
	registry_rendezvous_remove(registry_fd, cl->key);
	sys_close(cl->rendezvous);
	cl->rendezvous = -1;
	registry_rendezvous_count(registry_fd, -1);
}

/* The TCP connect itself; for a non-blocking socket wait (bounded) for it. */
static int client_tcp_connect(struct client *cl, const struct sockaddr *sa, socklen_t len,
                              int *timed_out)
{
	int err = 0;
	socklen_t l = sizeof(err);

	*timed_out = 0;
	if (sys_connect(cl->fd, sa, len) == 0)
		return 0;
	if (errno != EINPROGRESS)
		return -1;
	if (hs_msg_wait_fd(cl->fd, POLLOUT, mono_now_ms() + cfg.handshake_ms) < 0) {
		*timed_out = 1;
		errno = EINPROGRESS;
		return -1;
	}
	sys_getsockopt(cl->fd, SOL_SOCKET, SO_ERROR, &err, &l);
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

/*
 * Wait for the server's ACCEPT (pair end, TCP socket) or DECLINE on the
 * rendezvous socket; anything else that arrives there is dropped.
 */
static int client_wait_accept(struct client *cl, union clc_msg *m, int fds[2])
{
	long deadline = mono_now_ms() + cfg.handshake_ms;

	do {
		if (hs_msg_recv(cl->rendezvous, CLC_ACCEPT, 0, m, fds, 2, deadline) == 0)
			return m->hdr.type == CLC_DECLINE ? (int)m->decline.reason : R_NONE;
	} while (mono_now_ms() < deadline);
	/* a last look before the socket goes: the answer may have landed just now */
	registry_rendezvous_remove(registry_fd, cl->key);
	if (hs_msg_recv(cl->rendezvous, CLC_ACCEPT, 0, m, fds, 2, 0) == 0)
		return m->hdr.type == CLC_DECLINE ? (int)m->decline.reason : R_NONE;
	return R_TIMEOUT;
}

/* After ACCEPT: check, build the region; CONFIRM over @pair commits us. */
static int client_complete(struct client *cl, int pair, const union clc_msg *acc, int tcp_fd,
                           struct shm_parts *p)
{
	uid_t uid = (uid_t)-1;
	pid_t server = proof_peer_pid_allowed(pair, &uid);
	union clc_msg m;
	int reason = R_NONE, out[2];

	if (server < 0)
		reason = R_DIFF_USER;
	else if (!proof_ok(&cl->src, &cl->dst, cl->netns, tcp_fd, uid))
		reason = R_PROOF_FAILED;
	if (reason == R_NONE) {
		p->up = cfg.tx_size < acc->accept.rx_max ? cfg.tx_size : acc->accept.rx_max;
		p->down = acc->accept.ring_size < cfg.rx_max ? acc->accept.ring_size : cfg.rx_max;
		/* the kernel names the pair's maker: the only process this region goes to */
		p->region = region_get(peerid_of_socket(pair, server), p->up, p->down, &out[0]);
		p->sh = shared_new();
		if (!p->region || !p->sh)
			reason = R_NO_MEMORY;
	}
	if (reason != R_NONE) {
		hs_msg_decline_init(&m, acc->hdr.nonce, reason);
		hs_msg_send(pair, &m, NULL, 0);
		return reason;
	}
	clc_init(&m, CLC_CONFIRM, acc->hdr.nonce);
	m.accept.pid = (uint32_t)sys_getpid();
	m.accept.ring_size = p->up;
	m.accept.rx_max = p->down;
	m.accept.netns = cl->netns;
	out[1] = cl->fd;
	/* EPIPE: the server gave up first; anything else is ours (out of
	 * descriptors): either way both use TCP, the server at once */
	if (hs_msg_send(pair, &m, out, 2) == 0)
		return R_NONE;
	return errno == EPIPE ? R_TIMEOUT : R_HANDSHAKE_ERROR;
}

/* Put the pair end where the TCP socket was, keeping the fd's flags. */
static void client_install(struct client *cl, int s, struct shm_parts *p)
{
	int fl = sys_fcntl(cl->fd, F_GETFL, 0);
	int fdfl = sys_fcntl(cl->fd, F_GETFD, 0);
	int domain = proof_domain_of(cl->fd);
	int tcp;

	p->rcvtimeo_ms = sockopt_copy_timeouts(cl->fd, s);
	install_carry_signals(cl->fd, s, 1);    /* connect() waited here: O_ASYNC came before */
	tcp = io_keep_copy(cl->fd, 0);
	io_swap_begin(cl->fd);          /* epoll sets that hold it follow the switch */
	sys_dup3(s, cl->fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	fd_forget_ours(s);      /* the program's now, under cl->fd */
	sys_close(s);
	if (fl & O_NONBLOCK)            /* the server hands its end over blocking */
		sys_fcntl(cl->fd, F_SETFL, sys_fcntl(cl->fd, F_GETFL, 0) | O_NONBLOCK);
	install_shm(cl->fd, tcp, ROLE_CLIENT, p, &cl->src, &cl->dst, domain, (fl & O_NONBLOCK) != 0);
	if (fl & O_ASYNC) {
		struct conn *c = fd_get_conn(cl->fd);

		if (c) {
			io_bell_each(c);
			conn_put(c);
		}
	}
	io_swap_end(cl->fd);
}

/*
 * The connection stays on TCP, listed with why.  Where nobody listens
 * through smclo (the common case of a client of some other server) the
 * local address is not asked of the kernel: a system call per connection,
 * 1.5-2% of the connection's CPU, for a column of `smclo stat` ("-").
 */
static int client_fallback(struct client *cl, int reason)
{
	struct ep peer = cl->dst;

	if (cl->src.port == 0 && reason != R_PEER_NO_SMCLO)
		ep_of_socket(cl->fd, 0, &cl->src);
	DBG("connect fd %d: tcp (%s)", cl->fd, reason_text(reason));
	install_tcp(cl->fd, ROLE_CLIENT, reason, &cl->src, &peer);
	return 0;
}

/* ACCEPT arrived: finish, or fall back; returns connect()'s result. */
static int client_finish(struct client *cl, union clc_msg *acc, int fds[2])
{
	struct shm_parts parts = { 0 };
	int reason = client_complete(cl, fds[0], acc, fds[1], &parts);

	sys_close(fds[1]);
	if (reason != R_NONE) {
		sys_close(fds[0]);
		install_parts_free(&parts);
		return client_fallback(cl, reason);
	}
	DBG("connect fd %d: shm (ring tx %u rx %u)", cl->fd, parts.up, parts.down);
	client_install(cl, fds[0], &parts);
	return 0;
}

/* ---- client side: the inbox handshake (inbox.h) ------------------------ */

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/*
 * Region and socket pair for an offer to the listener's process; -1 if not.
 * Who reads the inbox cannot be asked of the kernel, so the region is one
 * for the link the offer goes through (inbox_link, peerid.h), never for a
 * pid the registry names: that is a number of the server's PID namespace.
 */
static int offer_prepare(struct client *cl, struct shm_parts *p, int pair[2],
                         int fds[OFFER_FDS], union clc_msg *m, enum clc_type type)
{
	const struct listener_offer *lo = &cl->listener.offer;

	if (!ring_size_valid(lo->tx_size) || !ring_size_valid(lo->rx_max))
		return -1;
	cl->via = inbox_link(&cl->listener, type == CLC_DIRECT ? lo->direct : lo->inbox);
	if (cl->via == PEERID_NONE)
		return -1;
	p->up = min_u32(cfg.tx_size, lo->rx_max);
	p->down = min_u32(lo->tx_size, cfg.rx_max);
	p->region = region_get(cl->via, p->up, p->down, &fds[OFFER_FD_REGION]);
	p->sh = shared_new();
	if (!p->region || !p->sh || (cl->pair_ahead = pairs_take(pair)) < 0) {
		install_parts_free(p);
		return -1;
	}
	atomic_store(&region_up(p->region)->offer, OFFER_OPEN);
	atomic_store(&region_up(p->region)->tcp_prefix, 0);     /* a region used before */
	clc_init(m, type, 0);          /* a CLC_DIRECT begins as a CLC_OFFER */
	m->accept.pid = (uint32_t)sys_getpid();
	m->accept.ring_size = p->up;
	m->accept.rx_max = p->down;
	m->accept.netns = cl->netns;
	fds[OFFER_FD_TCP] = cl->fd;
	fds[OFFER_FD_PAIR] = pair[1];
	return 0;
}

/*
 * Send a prepared offer to inbox @id of the listener's process; the
 * server's end of the pair goes with it.  On failure everything the offer
 * held is released.
 */
static int offer_send(struct client *cl, uint64_t id, const union clc_msg *m,
                      const int fds[OFFER_FDS], int pair[2], struct shm_parts *p)
{
	if (inbox_send(&cl->listener, id, cl->via, m, fds) < 0) {
		sys_close(pair[0]);
		sys_close(pair[1]);
		install_parts_free(p);
		return -1;
	}
	sys_close(pair[1]);
	return 0;
}

static int offer_reason(uint32_t w)
{
	int r = OFFER_REASON(w);

	if (w == OFFER_WITHDRAWN)
		return R_TIMEOUT;
	return r > R_NONE && r < R_COUNT ? r : R_HANDSHAKE_ERROR;
}

/* ---- a connection whose offer is not decided yet ("pending") ----------- */

/*
 * An offer to a listener that defers accept, kept from connect() to the
 * first write and sent just before its bytes go over TCP: the server is
 * woken by those bytes, so it finds the offer queued.  Sent at connect(),
 * the offers of a burst of connects (ab -c 20 connects all before it
 * writes) would fill the inbox's queue - the kernel takes 10 datagrams
 * from strangers - long before a first byte woke anyone to read it.
 * Our copy of the server's end of the pair stays open until the decision:
 * a server that drops the offer (declines, or a reader of a shared inbox
 * that finds it stale) then never hangs our doorbell up, which an epoll
 * set watching it (epoll_early.c) would report as the program's hang-up.
 */
struct hs_unsent {
	struct listener_info li;
	peerid via;
	union clc_msg m;
	int pair_end;           /* the server's end of the pair (hidden) */
	int region_fd;          /* the region's, which keeps it open */
	int sent;
};

static void unsent_free(struct conn *c)
{
	if (!c->unsent)
		return;
	sys_close(c->unsent->pair_end);
	free(c->unsent);
	c->unsent = NULL;
}

/* Send @c's kept offer, with @fd as the TCP socket: 0, or -1 (TCP then);
 * the decision frees it (hs_resolve). */
static int unsent_send(struct conn *c, int fd)
{
	struct hs_unsent *u;
	int fds[OFFER_FDS], rc = 0;

	shared_lock(&c->sh->tx_lock);   /* another thread's first write waits for it */
	if ((u = c->unsent) && !u->sent) {
		fds[OFFER_FD_TCP] = fd;
		fds[OFFER_FD_PAIR] = u->pair_end;
		fds[OFFER_FD_REGION] = u->region_fd;
		rc = inbox_send(&u->li, u->li.offer.inbox, u->via, &u->m, fds);
		u->sent = rc == 0;
	}
	shared_unlock(&c->sh->tx_lock);
	return rc;
}



/*
 * TCP is up and the offer is out: give the descriptor back to the
 * application at once, as TCP's connect() would, and decide at its next
 * call that needs to know (hs_resolve).  Writes that fit go into the ring
 * meanwhile (tx_send_pending), so a request is already there when the
 * server takes the offer, and a client that then reads is woken once, by
 * the answer.  Returns -1 if the connection object cannot be made.
 */
static int client_pending(struct client *cl, int pair_end, struct shm_parts *p,
                          struct hs_unsent *unsent)
{
	int fl = sys_fcntl(cl->fd, F_GETFL, 0);
	struct conn *c;

	if (!p->direct)                 /* a direct one bound its socket: src is known */
		ep_of_socket(cl->fd, 0, &cl->src);
	if (!(c = install_new_shm(cl->fd, ROLE_CLIENT, p, &cl->src, &cl->dst, proof_domain_of(cl->fd),
	                       (fl & O_NONBLOCK) != 0)))
		return -1;
	/* from now on a fork decides every pending connection first (hs_fork_decide) */
	atomic_store_explicit(&pending_made, 1, memory_order_relaxed);
	c->bell_fd = pair_end;          /* hidden, its send buffer sized (pairs.h) */
	c->sh->rcvtimeo_ms = 0;                 /* looked up when it is the pair's */
	c->pending_until_ms = mono_now_ms() + cfg.handshake_ms;
	atomic_store(&c->pending, PENDING_OPEN);
	c->tcp_prefix = cl->listener.defers ? CONN_PREFIX_WAIT : 0;
	c->unsent = unsent;
	fd_bind_conn(c, cl->fd);
	fd_add_flags(cl->fd, FDF_PENDING | (cl->listener.defers ? FDF_PREFIX : 0));
	DBG("connect fd %d: offer pending%s", cl->fd,
	    cl->listener.defers ? ", first bytes over TCP" : "");
	/* a pending connection holds three descriptors: where they are short
	 * (fdtab.h, fd_budget_is_small), decide now and keep one */
	if (fd_budget_is_small())
		hs_resolve(cl->fd, c, 0);
	conn_put(c);
	return 0;
}

/* The server took the offer: our end of the pair takes the descriptor's place. */
static void pending_take(int fd, struct conn *c)
{
	int fl = sys_fcntl(fd, F_GETFL, 0), fdfl = sys_fcntl(fd, F_GETFD, 0);

	c->sh->rcvtimeo_ms = sockopt_copy_timeouts(fd, c->bell_fd) + 1;
	c->tcp_fd = io_keep_copy(fd, 0);
	if (install_carry_signals(fd, c->bell_fd, 1))
		io_bell_each(c);
	io_swap_begin(fd);
	sys_dup3(c->bell_fd, fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	fd_forget_ours(c->bell_fd);
	sys_close(c->bell_fd);
	c->bell_fd = -1;
	conn_note_bell(c, fd);
	if (fl & O_NONBLOCK)            /* options and flags set meanwhile went to the TCP socket */
		sys_fcntl(fd, F_SETFL, sys_fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
	atomic_store(&c->sh->nonblock, (fl & O_NONBLOCK) != 0);
	install_go_lean(c);
	io_swap_end(fd);
	stats_slot_decide(totals, c->slot, MODE_SHM, R_NONE);
	DBG("connect fd %d: shm through the inbox (ring tx %u rx %u)", fd, c->tx_size, c->rx_size);
}

/*
 * A direct connection that falls back has no TCP connection yet: make it
 * now, as connect() would have (waiting at most the handshake timeout for
 * a non-blocking socket).  If it fails, the descriptor is a socket whose
 * connect failed, and the application's next call says so.
 */
static int pending_connect(int fd, struct conn *c, long until)
{
	struct sockaddr_storage ss;
	socklen_t l = ep_to_sockaddr(&c->peer, (fd_flags(fd) & FDF_INET6) ? AF_INET6 : AF_INET,
	                             &ss);
	int err = 0;
	socklen_t el = sizeof(err);

	c->direct = 0;
	if (sys_connect(fd, &ss, l) == 0)
		return 0;
	if (errno != EINPROGRESS || hs_msg_wait_fd(fd, POLLOUT, until) < 0)
		return -1;
	sys_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
	return err ? -1 : 0;
}

/*
 * Nobody will read the ring: what the application wrote into it goes into
 * the TCP socket, before anything else can, and the connection is TCP.
 */
static void pending_fall_back(int fd, struct conn *c, int reason)
{
	const uint8_t *data = ring_data(c->tx);
	/* a first write that went over TCP (c->tcp_prefix) is there already */
	uint64_t n = c->sh->prod, done = c->tcp_prefix & ~CONN_PREFIX_WAIT;
	long until = mono_now_ms() + cfg.handshake_ms;

	if (c->direct && pending_connect(fd, c, until) < 0)
		n = 0;          /* nowhere to put them: the connection failed */
	while (done < n) {
		ssize_t k = sys_send(fd, data + done, (size_t)(n - done), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0)
			done += (uint64_t)k;
		else if ((k < 0 && errno != EAGAIN && errno != EINTR) ||
		         hs_msg_wait_fd(fd, POLLOUT, until) < 0)
			break;  /* the connection is gone, or nobody reads: as TCP would lose it */
	}
	sys_close(c->bell_fd);
	c->bell_fd = -1;
	c->mode = MODE_TCP;
	stats_slot_decide(totals, c->slot, MODE_TCP, reason);
	DBG("connect fd %d: tcp (%s), %llu bytes replayed", fd, reason_text(reason),
	    (unsigned long long)done);
}

/*
 * The server answered over TCP (bytes, or its end) while our offer is
 * open: it accepted without finding the offer (another reader of a shared
 * inbox held it out too long, inbox.c) and never takes it now - only the
 * process that accepted a connection can match its offer.  Withdrawn at
 * once, with *@w the decision, instead of waiting out the handshake in a
 * read the answer is already there for.
 */
static int pending_answered_on_tcp(int fd, struct conn *c, uint32_t *w)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	/* a direct offer has no TCP connection yet: its socket reads hung up */
	if (c->direct || sys_poll(&p, 1, 0) != 1)
		return 0;
	*w = inbox_offer_withdraw(region_up(c->region));
	if (*w == OFFER_WITHDRAWN)
		*w = OFFER_DECLINED | (uint32_t)R_OFFER_MISSED << 8;
	return 1;
}

#define PENDING_LOOK_MS 10     /* how often a wait for the decision looks at TCP */

/*
 * Wait for the server's decision, until the handshake's deadline, looking
 * every PENDING_LOOK_MS whether it answered over TCP instead (it missed
 * the offer: pending_answered_on_tcp), which nothing would wake us for.
 */
static uint32_t pending_wait(int fd, struct conn *c, size_t reading)
{
	struct ring_hdr *up = region_up(c->region);
	int interrupted = 0;
	uint32_t w;

	/* a read that may time out waits for the decision only: its own wait
	 * honours SO_RCVTIMEO (the decision comes within the handshake timeout);
	 * so does one a signal interrupted, which then fails with EINTR */
	if (!reading || sockopt_may_have_timeouts(fd))
		interrupted = -1;
	/* TCP is looked at only once a slice passed undecided: a decision
	 * usually comes first, and the look is a system call */
	do {
		long look = mono_now_ms() + PENDING_LOOK_MS;
		if (interrupted == 0)
			w = inbox_offer_wait_reading(up, reading < c->rx_size ? (uint32_t)reading
			                                                     : c->rx_size,
			                             c->pending_until_ms, look, &interrupted);
		else
			w = inbox_offer_wait(up, c->pending_until_ms, look);
	} while (w == OFFER_OPEN && !pending_answered_on_tcp(fd, c, &w));
	if (interrupted == 1 && w == OFFER_TAKEN)
		rx_note_interrupted();  /* for the read in the ring that follows */
	return w;
}

void hs_resolve(int fd, struct conn *c, size_t reading)
{
	int open = PENDING_OPEN;
	uint32_t w;

	if (!atomic_compare_exchange_strong(&c->pending, &open, PENDING_DECIDING)) {
		/* another thread decides; its wait is bounded */
		while (atomic_load(&c->pending) == PENDING_DECIDING)
			nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
		return;
	}
	if (c->tcp_prefix == CONN_PREFIX_WAIT) {
		/* nothing woke the server yet, and nothing will: TCP at once (the
		 * kept offer is freed below, under the lock unsent_send holds) */
		w = inbox_offer_withdraw(region_up(c->region));
		fd_clear_flags(fd, FDF_PREFIX);
		if (w == OFFER_WITHDRAWN)
			w = OFFER_DECLINED | (uint32_t)R_DEFER_ACCEPT << 8;
	} else {
		w = pending_wait(fd, c, reading);
	}
	shared_lock(&c->sh->tx_lock);       /* no pending write is half done */
	io_bell_unwatch(fd);                /* before the doorbell moves or closes */
	unsent_free(c);
	if (w == OFFER_TAKEN)
		pending_take(fd, c);
	else
		pending_fall_back(fd, c, offer_reason(w));
	fd_clear_flags(fd, FDF_PENDING);
	atomic_store(&c->pending, PENDING_NONE);
	shared_unlock(&c->sh->tx_lock);
}

#define PREFIX_IOV_MAX 64      /* pieces of a first write sent as one (on the stack) */

/*
 * The rest of a blocking first write after its head went over TCP: the
 * server, woken, decides now, and the rest follows as the decision says.
 */
static ssize_t prefix_rest(int fd, struct conn *c, const struct iovec *iov, int n, size_t skip,
                           int flags)
{
	struct iovec tail[PREFIX_IOV_MAX];
	int tn = iov_tail(iov, n, skip, tail, PREFIX_IOV_MAX);
	struct msghdr m = { .msg_iov = tail, .msg_iovlen = (size_t)tn };

	hs_resolve(fd, c, 0);
	if (c->mode == MODE_SHM)
		return tx_send(c, fd, tail, tn, flags);
	return sys_result(sys_sendmsg(fd, &m, flags));
}

/*
 * The epoll sets that hold @fd watch its doorbell until the decision
 * (epoll_early.c); -1 if they cannot.  Under the lock the decision's
 * unwatch takes, and only while nobody decides: a watch made after that
 * unwatch would name a doorbell about to be closed.
 */
static int prefix_bell_watch(int fd, struct conn *c)
{
	int rc = 0;

	shared_lock(&c->sh->tx_lock);
	if (atomic_load(&c->pending) == PENDING_OPEN)
		rc = io_bell_watch(fd, c->bell_fd);
	shared_unlock(&c->sh->tx_lock);
	return rc;
}

/* Would a first write sit in the socket instead of waking the server? */
static int prefix_corked(int fd)
{
	int v = 0;
	socklen_t l = sizeof(v);

	return sys_getsockopt(fd, IPPROTO_TCP, TCP_CORK, &v, &l) == 0 && v;
}

int hs_send_prefix(int fd, const struct iovec *iov, int n, int flags, ssize_t *sent)
{
	struct conn *c;
	struct iovec head[PREFIX_IOV_MAX];
	size_t total;
	int hn, blocking;
	ssize_t k, rest;

	if (!(c = fd_get_conn(fd)))
		return 0;
	/* urgent data, a socket corked, a vector of many pieces (or one the
	 * kernel would refuse): TCP for good, at once */
	if ((flags & MSG_OOB) || n < 0 || n > PREFIX_IOV_MAX || prefix_corked(fd)) {
		hs_resolve(fd, c, 0);
		conn_put(c);
		return 0;
	}
	total = iov_total(iov, n);
	if (total == 0) {               /* TCP sends nothing either */
		conn_put(c);
		*sent = 0;
		return 1;
	}
	/* at most what the socket takes at once: the server reads none of it
	 * before it has all of it, and a blocking send would wait for it */
	hn = iov_head(iov, n, PENDING_MAX, head, PREFIX_IOV_MAX);
	blocking = !(flags & MSG_DONTWAIT) && !(sys_fcntl(fd, F_GETFL, 0) & O_NONBLOCK);
	if (unsent_send(c, fd) < 0) {
		hs_resolve(fd, c, 0);   /* the inbox stayed full: TCP at once, nothing sent */
		conn_put(c);
		return 0;
	}
	k = tx_send_prefix(c, fd, head, hn, flags | MSG_DONTWAIT);
	if (k == -EALREADY || (k == -EAGAIN && blocking)) {
		if (k == -EAGAIN)
			hs_resolve(fd, c, 0);   /* nothing sent: TCP at once */
		conn_put(c);
		return 0;       /* an ordinary write from here */
	}
	if (k >= 0) {
		c->pending_until_ms = mono_now_ms() + cfg.handshake_ms;
		fd_clear_flags(fd, FDF_PREFIX);
		DBG("send fd %d: %zd bytes over TCP first, to wake the server", fd, k);
	}
	if (k > 0 && (size_t)k < total && blocking &&
	    (rest = prefix_rest(fd, c, iov, n, (size_t)k, flags)) > 0)
		k += rest;
	else if (k > 0 && fd_epoll_early_count(fd) && prefix_bell_watch(fd, c) < 0)
		hs_resolve(fd, c, 0);   /* a set may sleep on it: decided now (the server is up) */
	conn_put(c);
	*sent = k < 0 ? -1 : k;
	if (k < 0)
		errno = (int)-k;
	return 1;
}

void hs_resolve_fd(int fd)
{
	struct conn *c;

	if (!(fd_flags(fd) & FDF_PENDING) || sys_in_vfork_child() || !(c = fd_get_conn(fd)))
		return;         /* a vfork child would decide in its parent's memory */
	if (atomic_load(&c->pending) != PENDING_NONE)
		hs_resolve(fd, c, 0);
	conn_put(c);
}

static void resolve_one(int fd, struct conn *c, void *arg)
{
	/* the walk holds no reference, and another thread may be closing it:
	 * decided with one (before fork, no guarded lock is held yet) */
	if (atomic_load(&c->pending) == PENDING_NONE || !(c = fd_get_conn(fd)))
		return;
	if (atomic_load(&c->pending) != PENDING_NONE)
		hs_resolve(fd, c, 0);
	conn_put(c);
}

/* A child must not inherit an undecided connection: decide them all first. */
void hs_resolve_all(void)
{
	fd_for_each_conn(resolve_one, NULL);
}

void hs_fork_decide(void)
{
	if (atomic_load_explicit(&pending_made, memory_order_relaxed))
		hs_resolve_all();
}

/*
 * client_offer for a listener that defers accept: the TCP connect, and a
 * pending connection whose offer waits for its first write (hs_unsent).
 * Nothing was sent if it cannot be pending: TCP at once.
 */
static int client_offer_prefix(struct client *cl, const struct sockaddr *sa, socklen_t len,
                               union clc_msg *m, const int fds[OFFER_FDS], int pair[2],
                               struct shm_parts *p, int *rc)
{
	struct hs_unsent *u = malloc(sizeof(*u));
	int timed_out, e;

	if (!u) {
		sys_close_all(pair, 2);
		install_parts_free(p);
		return -1;
	}
	m->accept.flags = CLC_OFFER_F_TCP_PREFIX;
	*u = (struct hs_unsent){ .li = cl->listener, .via = cl->via, .m = *m,
	                         /* kept until the decision: hidden, as a pair
	                          * made ahead already is */
	                         .pair_end = cl->pair_ahead ? pair[1] : io_keep_fd(pair[1]),
	                         .region_fd = fds[OFFER_FD_REGION] };
	*rc = client_tcp_connect(cl, sa, len, &timed_out);
	e = errno;
	if (*rc == 0 && client_pending(cl, pair[0], p, u) == 0)
		return 0;
	sys_close(u->pair_end);
	free(u);
	sys_close(pair[0]);
	install_parts_free(p);
	if (*rc == 0 || timed_out)
		client_fallback(cl, R_DEFER_ACCEPT);
	errno = e;
	return 0;
}

/*
 * The offer goes to the inbox before the SYN; then the TCP connect.  Returns
 * -1 if the offer could not be sent (nothing has happened yet: the
 * rendezvous handshake takes over), else 0 with *rc and errno as connect()
 * leaves them.
 */
static int client_offer(struct client *cl, const struct sockaddr *sa, socklen_t len, int *rc)
{
	struct shm_parts p = { 0 };
	union clc_msg m;
	int pair[2], fds[OFFER_FDS], timed_out, e;
	uint32_t w;

	if (offer_prepare(cl, &p, pair, fds, &m, CLC_OFFER) < 0)
		return -1;
	if (cl->listener.defers)
		return client_offer_prefix(cl, sa, len, &m, fds, pair, &p, rc);
	if (offer_send(cl, cl->listener.offer.inbox, &m, fds, pair, &p) < 0)
		return -1;
	*rc = client_tcp_connect(cl, sa, len, &timed_out);
	e = errno;
	/* a program asleep in an epoll set it added the socket to before
	 * connect() would wait for a decision nothing makes: decided here */
	if (*rc == 0 && !fd_epoll_early_count(cl->fd) && client_pending(cl, pair[0], &p, NULL) == 0)
		return 0;
	/* a connect that failed outright reached no server: nobody can take it */
	w = *rc == 0 || timed_out ?
	    inbox_offer_wait(region_up(p.region), mono_now_ms() + cfg.handshake_ms, 0) :
	    inbox_offer_withdraw(region_up(p.region));
	ep_of_socket(cl->fd, 0, &cl->src);
	if (w == OFFER_TAKEN) {
		DBG("connect fd %d: shm through the inbox (ring tx %u rx %u)", cl->fd, p.up, p.down);
		client_install(cl, pair[0], &p);
		*rc = 0;
		return 0;
	}
	sys_close(pair[0]);
	install_parts_free(&p);
	if (*rc == 0 || timed_out)
		client_fallback(cl, offer_reason(w));
	errno = e;
	return 0;
}

/*
 * A direct connection has an address of its own, as TCP's would: the
 * socket is bound to the address the kernel's route would pick and an
 * ephemeral port, unless the application bound it.  A local destination
 * is its own source, except in 127.0.0.0/8, whose route says "src
 * 127.0.0.1" (127.0.0.2 is reached from 127.0.0.1).
 */
static int direct_bind(struct client *cl)
{
	struct sockaddr_storage ss;
	struct ep here = cl->dst;
	socklen_t l;

	if (ep_of_socket(cl->fd, 0, &cl->src) < 0)
		return -1;
	if (cl->src.port)
		return 0;
	here.port = 0;
	if (ep_is_v4(&here) && here.ip[12] == 127)
		memcpy(&here.ip[12], (const uint8_t[]){ 127, 0, 0, 1 }, 4);
	l = ep_to_sockaddr(&here, (fd_flags(cl->fd) & FDF_INET6) ? AF_INET6 : AF_INET, &ss);
	if (sys_bind(cl->fd, &ss, l) < 0 || ep_of_socket(cl->fd, 0, &cl->src) < 0)
		return -1;
	return 0;
}

/*
 * The direct handshake: the listener's process takes connections without
 * TCP (it waits in accept() where it sees the listener's direct inbox), so
 * the offer is the whole set-up - no SYN, no TCP connection, nothing to
 * reset at close.  connect() returns at once and the connection is pending
 * like any inbox offer's (hs_resolve); if the server does not take it, the
 * TCP connection is made then and what was written is replayed into it.
 * Returns -1 if the offer could not be sent (the socket may be bound now).
 */
static int client_direct(struct client *cl)
{
	struct shm_parts p = { .direct = 1 };
	union clc_msg m;
	int pair[2], fds[OFFER_FDS];

	/* the family for bind() and a later connect() comes from the fd table */
	if (!(fd_flags(cl->fd) & FDF_KNOWN) || direct_bind(cl) < 0 ||
	    offer_prepare(cl, &p, pair, fds, &m, CLC_DIRECT) < 0)
		return -1;
	memcpy(m.direct.dst_ip, cl->dst.ip, sizeof(m.direct.dst_ip));
	m.direct.dst_port = cl->dst.port;
	if (offer_send(cl, cl->listener.offer.direct, &m, fds, pair, &p) < 0)
		return -1;
	if (client_pending(cl, pair[0], &p, NULL) == 0)
		return 0;
	/* no memory for the connection: a server that took it sees the pair hang up */
	inbox_offer_withdraw(region_up(p.region));
	sys_close(pair[0]);
	install_parts_free(&p);
	return -1;
}

int hs_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct client cl = { .fd = fd, .rendezvous = -1 };
	union clc_msg acc;
	int reason, timed_out, fds[2];

	if (ep_from_sockaddr(&cl.dst, sa, len) < 0)
		return sys_connect(fd, sa, len);
	if (!payoff_worth_offering(&cl.dst)) {
		/* counted, not listed: it would be gone before anyone looked */
		stats_slot_decide(totals, NULL, MODE_TCP, R_SHORT_LIVED);
		return sys_connect(fd, sa, len);
	}
	reason = client_precheck(&cl);
	if (reason == R_NONE && cl.listener.exclusive && cfg.inbox) {
		int rc;
		/* without a SYN, a socket in an epoll set would report a hang-up;
		 * io_uring could come to use it, and it could not move */
		if (cl.listener.offer.direct && cfg.direct && !fd_epoll_early_count(fd) &&
		    !cl.listener.defers && !proof_io_uring_any() && client_direct(&cl) == 0)
			return 0;
		if (client_offer(&cl, sa, len, &rc) == 0)
			return rc;
		if (cl.listener.defers)
			reason = R_DEFER_ACCEPT;        /* a rendezvous would wait for nothing */
	}
	if (reason == R_NONE && client_bind(&cl) < 0)
		reason = R_NO_PORT;
	if (reason == R_NONE)
		reason = client_rendezvous_open(&cl);
	if (reason != R_NONE) {
		int rc, e;

		client_restore_reuse(&cl);
		rc = sys_connect(fd, sa, len);
		e = errno;
		if (rc < 0 && e != EINPROGRESS)
			return -1;
		client_fallback(&cl, reason);
		errno = e;
		return rc;
	}
	if (client_tcp_connect(&cl, sa, len, &timed_out) < 0) {
		int e = errno;
		client_rendezvous_close(&cl);
		client_restore_reuse(&cl);
		if (timed_out)
			client_fallback(&cl, R_TIMEOUT);
		errno = e;
		return -1;
	}
	client_restore_reuse(&cl);
	ep_of_socket(fd, 0, &cl.src);        /* the address the route chose, now known */
	reason = client_wait_accept(&cl, &acc, fds);
	client_rendezvous_close(&cl);
	if (reason != R_NONE)
		return client_fallback(&cl, reason);
	return client_finish(&cl, &acc, fds);
}
