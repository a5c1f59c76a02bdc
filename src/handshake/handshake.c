/*
 * handshake.c - the switch from TCP to shared memory (the kernel's CLC).
 *
 *   client connect()                         server accept()
 *   ----------------                         ---------------
 *   find a live smclo listener for dst
 *   bind to learn the source port
 *   bind the rendezvous socket p/<tuple>
 *   TCP connect  ------------------------->  kernel accepts the TCP connection
 *   wait on the rendezvous socket            p/<tuple> exists? no: plain TCP
 *                                            socket pair, ring
 *                     <------------ ACCEPT   sent to p/<tuple>: one end of the
 *                                            pair, ring, TCP socket as proof
 *   check proof, map ring, build ring
 *   CONFIRM over the pair ---------------->  check proof, map ring
 *   (ring, TCP socket as proof)
 *   app fd := our end of the pair            return our end of the pair
 *
 * One round trip, and the client's wait for ACCEPT overlaps the server's
 * wake-up from accept(), which TCP pays as well.  No byte is ever sent
 * in-band: a peer without smclo only ever sees an ordinary TCP connection.
 *
 * Deciding exactly once, with both waits bounded by SMCLO_HANDSHAKE_MS:
 *  - a client that gives up removes and closes its rendezvous socket; an
 *    ACCEPT that arrives later is dropped with it, which closes the pair end
 *    it carried, and the server sees the pair hang up: both stay on TCP;
 *  - a server that gives up waiting for CONFIRM shuts the pair down for
 *    reading first, which the kernel orders against the client's send: a
 *    CONFIRM queued before still counts (the server takes a last look), one
 *    sent after fails with EPIPE and the client stays on TCP as well.
 * The client stays inside connect() and the server inside accept() until the
 * decision, so nothing has been written yet and a fallback loses nothing.
 * An epoll registration made before connect() would not follow the switch
 * (it names the TCP socket): such a socket stays on TCP (R_EPOLL_EARLY,
 * counted in preload.c's epoll_ctl); one made after, while a non-blocking
 * connect is still undecided, first decides it (hs_resolve_fd).
 *
 * Same-connection proof: each side hands the other its TCP socket.  The
 * receiver checks that the addresses are mirror images and that both sockets
 * live in one network namespace (where the kernel keeps the 4-tuple unique),
 * or, across namespaces, that the client reached a non-loopback address.
 * Identities come from the kernel: SO_PEERCRED of the pair the server made,
 * the owner of the ring the client made; nothing rests on a random number.
 * Processes are told apart by keys that hold across PID namespaces
 * (peerid.h), never by a pid another process wrote.
 */
#include "handshake.h"
#include "fdview.h"

#include "clc.h"
#include "config.h"
#include "conn.h"
#include "forkguard.h"
#include "inbox.h"
#include "io.h"
#include "log.h"
#include "pairs.h"
#include "payoff.h"
#include "peerid.h"
#include "region.h"
#include "registry.h"
#include "spin.h"
#include "sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <time.h>

/* The descriptor table's answers (fdview.h), set by the front end at start. */
static struct hs_fd_hooks fdv;

void hs_set_fd_hooks(const struct hs_fd_hooks *h)
{
	fdv = *h;
}

/* ---- small helpers ------------------------------------------------------ */

static uint64_t netns_cookie(int fd)
{
	uint64_t c = 0;
	socklen_t l = sizeof(c);

	sys_getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &c, &l);
	return c;
}

static int sock_is_tcp(int fd)
{
	int v = 0;
	socklen_t l = sizeof(v);

	return sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) == 0 && v == IPPROTO_TCP;
}

/* Is @dst an address of our own network namespace? */
static int dst_is_local(const struct ep *dst)
{
	struct sockaddr_in6 s = { .sin6_family = AF_INET6 };
	struct sockaddr_in s4 = { .sin_family = AF_INET };
	int v4 = ep_is_v4(dst);
	int fd = sys_socket(v4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int rc;

	if (fd < 0)
		return 0;
	memcpy(&s.sin6_addr, dst->ip, 16);
	memcpy(&s4.sin_addr, dst->ip + 12, 4);
	rc = v4 ? sys_bind(fd, &s4, sizeof(s4)) : sys_bind(fd, &s, sizeof(s));
	sys_close(fd);
	return rc == 0;
}

/* io_uring bypasses libc: such a process cannot be served through shared memory. */
static int io_uring_in_use(void)
{
	static _Atomic long checked_at = -1000;
	static _Atomic int found;
	long now = mono_now_ms();
	struct dirent *de;
	DIR *d;
	int hit = 0;

	if (now - atomic_load(&checked_at) < 100)
		return atomic_load(&found);
	d = opendir("/proc/self/fd");
	while (d && !hit && (de = readdir(d)) != NULL) {
		char link[64];
		ssize_t n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = '\0';
			hit = strcmp(link, "anon_inode:[io_uring]") == 0;
		}
	}
	if (d)
		closedir(d);
	atomic_store(&found, hit);
	atomic_store(&checked_at, now);
	return hit;
}

static int wait_fd(int fd, short events, long deadline)
{
	if (deadline > mono_now_ms() && spin_poll(fd, events))
		return 0;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		long left = deadline - mono_now_ms();
		int rc;

		if (left < 0)
			left = 0;
		rc = sys_poll(&p, 1, (int)left);
		if (rc > 0)
			return 0;
		if (rc == 0 || errno != EINTR)
			return -1;
	}
}

/* ---- handshake messages ------------------------------------------------- */

static int msg_send(int s, const union clc_msg *m, const int *fds, int nfds)
{
	struct clc_out o;

	return sys_sendmsg(s, clc_prepare(&o, m, fds, nfds), MSG_NOSIGNAL) ==
	       (ssize_t)m->hdr.length ? 0 : -1;
}

/* clc_recv(), waiting until @deadline for the message to arrive. */
static int msg_recv(int s, enum clc_type type, uint64_t nonce, union clc_msg *m,
                    int *fds, int want, long deadline)
{
	if (wait_fd(s, POLLIN, deadline) < 0)
		return -1;
	return clc_recv(s, type, nonce, m, fds, want);
}

static void decline_init(union clc_msg *m, uint64_t nonce, int reason)
{
	clc_init(m, CLC_DECLINE, nonce);
	m->decline.reason = (uint32_t)reason;
}

/* ---- checks on what the peer handed us ---------------------------------- */

/*
 * The process that made socket pair @s, if its user may attach; else -1.
 * 0: a process in a PID namespace we cannot see (another container's) -
 * allowed all the same, the pid only serves to recognise it (peerid.h).
 */
static pid_t peer_pid_allowed(int s)
{
	struct ucred cr;
	socklen_t l = sizeof(cr);

	if (sys_getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0 ||
	    !config_uid_allowed(&cfg, cr.uid))
		return -1;
	return cr.pid;
}

/*
 * Is @theirs the other end of our TCP connection @local -> @peer in the
 * namespace @netns?  (see top of file)
 */
/* The rest of the proof once the addresses of @theirs are known to mirror ours. */
static int proof_same_host(const struct ep *local, uint64_t netns, int theirs)
{
	if (!sock_is_tcp(theirs))
		return 0;
	if (netns_cookie(theirs) == netns)
		return 1;
	return cfg.cross_netns && !ep_is_loopback(local);
}

static int proof_ok(const struct ep *local, const struct ep *peer, uint64_t netns, int theirs)
{
	struct ep tl, tp;

	if (ep_of_socket(theirs, 0, &tl) || ep_of_socket(theirs, 1, &tp) ||
	    !ep_equal(local, &tp) || !ep_equal(peer, &tl))
		return 0;
	return proof_same_host(local, netns, theirs);
}

/* ---- connection objects ------------------------------------------------- */

/* A connection left on TCP: listed with its reason; SO_DOMAIN and the
 * rest are the real socket's own, so nothing else is looked up. */
static struct conn *conn_tcp(int fd, int role, int reason, const struct ep *l,
                             const struct ep *p)
{
	struct conn *c = conn_alloc(MODE_TCP);

	if (!c)
		return NULL;
	c->local = *l;
	c->peer = *p;
	c->slot = stats_slot_alloc(stats_table(registry_fd, NULL, 0), fd, role);
	if (c->slot) {
		c->slot->local = *l;
		c->slot->peer = *p;
	}
	stats_slot_decide(totals, c->slot, MODE_TCP, reason);
	fdv.bind_conn(c, fd);
	conn_put(c);
	return c;
}

/* The shared memory of a connection being set up. */
struct shm_parts {
	struct region *region;
	struct conn_shared *sh;
	uint32_t up, down;      /* ring data sizes, client->server and back */
	int rcvtimeo_ms;        /* SO_RCVTIMEO carried over (so_copy_timeouts) */
	int direct;             /* set up without a TCP connection (conn.direct) */
};

static void parts_free(struct shm_parts *p)
{
	if (p->region)
		region_put(p->region, 0);
	if (p->sh)
		conn_shared_put(p->sh, 0);
	memset(p, 0, sizeof(*p));
}

/*
 * A connection object for the shared memory in @p (taken over), not bound
 * yet; NULL (and @p left as it was) if there is no memory for one.
 */
static struct conn *conn_new_shm(int slot_fd, int role, struct shm_parts *p,
                                 const struct ep *l, const struct ep *r, int domain,
                                 int nonblock)
{
	struct conn *c = conn_alloc(MODE_SHM);

	if (!c)
		return NULL;
	c->domain = domain;
	c->region = p->region;
	if (role == ROLE_CLIENT) {
		c->tx = region_up(p->region);
		c->rx = region_down(p->region);
		c->tx_size = p->up;
		c->rx_size = p->down;
	} else {
		c->tx = region_down(p->region);
		c->rx = region_up(p->region);
		c->tx_size = p->down;
		c->rx_size = p->up;
	}
	c->sh = p->sh;
	c->direct = p->direct;
	c->sh->nonblock = nonblock;
	c->sh->rcvtimeo_ms = p->rcvtimeo_ms + 1;    /* known: no lookup at the first sleep */
	c->local = *l;
	c->peer = *r;
	c->slot = stats_slot_alloc(stats_table(registry_fd, NULL, 0), slot_fd, role);
	if (c->slot) {
		c->slot->local = *l;
		c->slot->peer = *r;
		c->slot->tx_ring = c->tx_size;
		c->slot->rx_ring = c->rx_size;
	}
	memset(p, 0, sizeof(*p));
	return c;
}

/*
 * Under a small descriptor budget (fdview.h, budget_small), once @c is set
 * up: close its hidden TCP socket (names from the handshake, options on a
 * socket made on demand, as for a direct connection) and the region
 * descriptor it keeps (no reuse, no exec handover for it).
 */
static void conn_go_lean(struct conn *c)
{
	if (!fdv.budget_small())
		return;
	if (c->tcp_fd >= 0) {
		/* its addresses are the connection's: kept, then the socket goes,
		 * with a reset rather than a TIME_WAIT (the peer's copy is idle) */
		struct linger l = { .l_onoff = 1, .l_linger = 0 };

		ep_of_socket(c->tcp_fd, 0, &c->local);
		ep_of_socket(c->tcp_fd, 1, &c->peer);
		sys_setsockopt(c->tcp_fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
		sys_close(c->tcp_fd);
		c->tcp_fd = -1;
		c->direct = 1;          /* names from what we recorded, options on demand */
	}
	if (c->region)
		region_drop_memfd(c->region);
}

/*
 * Bind the shared memory to @app_fd (the side connection's number from now
 * on) with @tcp_fd hidden beside it.
 */
static void conn_shm(int app_fd, int tcp_fd, int role, struct shm_parts *p,
                     const struct ep *l, const struct ep *r, int domain, int nonblock)
{
	int sndbuf = SIDE_SNDBUF;
	struct conn *c;

	sys_setsockopt(app_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	if (!(c = conn_new_shm(app_fd, role, p, l, r, domain, nonblock))) {
		parts_free(p);  /* cannot happen in practice; keep the descriptor sane */
		return;
	}
	c->tcp_fd = tcp_fd;
	conn_go_lean(c);
	stats_slot_decide(totals, c->slot, MODE_SHM, R_NONE);
	fdv.bind_conn(c, app_fd);
	conn_put(c);
}

/* What the socket was created as: known without a system call for the
 * sockets socket() and accept() made here (FDF_INET6). */
static int domain_of(int fd)
{
	uint16_t f = fdv.flags(fd);
	int v = AF_INET;
	socklen_t l = sizeof(v);

	if (f & FDF_SMC)
		return 43;      /* AF_SMC */
	if (f & FDF_KNOWN)
		return (f & FDF_INET6) ? AF_INET6 : AF_INET;
	sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l);
	return v;
}

/* ---- client side -------------------------------------------------------- */

struct client {
	int fd;                 /* the application's TCP socket */
	struct ep dst, src;
	uint64_t netns;
	struct listener_info listener;
	peerid via;             /* the inbox link an offer goes through (its region's key) */
	char key[96];
	int rendezvous;         /* our p/<key> socket, or -1 */
	int reuse_was_set;
	int bound_by_us;
};

/* Reasons not to try at all; R_NONE means go ahead. */
static int client_precheck(struct client *cl)
{
	if (registry_fd < 0)
		return R_NO_REGISTRY;
	if (registry_port_unlistened(registry_fd, cl->dst.port))
		return R_PEER_NO_SMCLO;         /* known without a system call */
	cl->netns = netns_cookie(cl->fd);
	registry_listener_find(registry_fd, &cl->dst, cl->netns, &cl->listener);
	switch (cl->listener.m) {
	case LM_NONE:      return R_PEER_NO_SMCLO;
	case LM_ELSEWHERE: return R_NOT_THIS_HOST;
	case LM_DEFER:     return R_DEFER_ACCEPT;
	case LM_UNREACHABLE: return R_NO_REGISTRY;
	case LM_OTHER_NETNS:
		if (!cfg.cross_netns)
			return R_CROSS_NETNS_OFF;
		if (dst_is_local(&cl->dst))
			return R_NOT_THIS_HOST;
		break;
	case LM_SAME_NETNS:
		break;
	}
	if (io_uring_in_use())
		return R_IO_URING;
	if (fdv.epoll_early(cl->fd))
		return R_EPOLL_EARLY;   /* preload.c, count_epoll_early */
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
	if (wait_fd(cl->fd, POLLOUT, mono_now_ms() + cfg.handshake_ms) < 0) {
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
		if (msg_recv(cl->rendezvous, CLC_ACCEPT, 0, m, fds, 2, deadline) == 0)
			return m->hdr.type == CLC_DECLINE ? (int)m->decline.reason : R_NONE;
	} while (mono_now_ms() < deadline);
	/* a last look before the socket goes: the answer may have landed just now */
	registry_rendezvous_remove(registry_fd, cl->key);
	if (msg_recv(cl->rendezvous, CLC_ACCEPT, 0, m, fds, 2, 0) == 0)
		return m->hdr.type == CLC_DECLINE ? (int)m->decline.reason : R_NONE;
	return R_TIMEOUT;
}

/* After ACCEPT: check, build the region; CONFIRM over @pair commits us. */
static int client_complete(struct client *cl, int pair, const union clc_msg *acc, int tcp_fd,
                           struct shm_parts *p)
{
	pid_t server = peer_pid_allowed(pair);
	union clc_msg m;
	int reason = R_NONE, out[2];

	if (server < 0)
		reason = R_DIFF_USER;
	else if (!proof_ok(&cl->src, &cl->dst, cl->netns, tcp_fd))
		reason = R_PROOF_FAILED;
	if (reason == R_NONE) {
		p->up = cfg.tx_size < acc->accept.rx_max ? cfg.tx_size : acc->accept.rx_max;
		p->down = acc->accept.ring_size < cfg.rx_max ? acc->accept.ring_size : cfg.rx_max;
		/* the kernel names the pair's maker: the only process this region goes to */
		p->region = region_get(peerid_of_socket(pair, server), p->up, p->down, &out[0]);
		p->sh = conn_shared_new();
		if (!p->region || !p->sh)
			reason = R_NO_MEMORY;
	}
	if (reason != R_NONE) {
		decline_init(&m, acc->hdr.nonce, reason);
		msg_send(pair, &m, NULL, 0);
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
	if (msg_send(pair, &m, out, 2) == 0)
		return R_NONE;
	return errno == EPIPE ? R_TIMEOUT : R_HANDSHAKE_ERROR;
}

/* Put the pair end where the TCP socket was, keeping the fd's flags. */
static void client_install(struct client *cl, int s, struct shm_parts *p)
{
	int fl = sys_fcntl(cl->fd, F_GETFL, 0);
	int fdfl = sys_fcntl(cl->fd, F_GETFD, 0);
	int domain = domain_of(cl->fd);
	int tcp;

	p->rcvtimeo_ms = fdv.copy_timeouts(cl->fd, s);
	tcp = io_keep_copy(cl->fd, 0);
	sys_dup3(s, cl->fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	fdv.release_kept(s);      /* the program's now, under cl->fd */
	sys_close(s);
	if (fl & O_NONBLOCK)            /* the server hands its end over blocking */
		sys_fcntl(cl->fd, F_SETFL, O_NONBLOCK);
	conn_shm(cl->fd, tcp, ROLE_CLIENT, p, &cl->src, &cl->dst, domain, (fl & O_NONBLOCK) != 0);
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
	conn_tcp(cl->fd, ROLE_CLIENT, reason, &cl->src, &peer);
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
		parts_free(&parts);
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
	p->sh = conn_shared_new();
	if (!p->region || !p->sh || pairs_take(pair) < 0) {
		parts_free(p);
		return -1;
	}
	atomic_store(&region_up(p->region)->offer, OFFER_OPEN);
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
		parts_free(p);
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

static void resolve_all_before_fork(void);

/*
 * TCP is up and the offer is out: give the descriptor back to the
 * application at once, as TCP's connect() would, and decide at its next
 * call that needs to know (hs_resolve).  Writes that fit go into the ring
 * meanwhile (tx_send_pending), so a request is already there when the
 * server takes the offer, and a client that then reads is woken once, by
 * the answer.  Returns -1 if the connection object cannot be made.
 */
static int client_pending(struct client *cl, int pair_end, struct shm_parts *p)
{
	static pthread_once_t fork_hook = PTHREAD_ONCE_INIT;
	int fl = sys_fcntl(cl->fd, F_GETFL, 0);
	struct conn *c;

	if (!p->direct)                 /* a direct one bound its socket: src is known */
		ep_of_socket(cl->fd, 0, &cl->src);
	if (!(c = conn_new_shm(cl->fd, ROLE_CLIENT, p, &cl->src, &cl->dst, domain_of(cl->fd),
	                       (fl & O_NONBLOCK) != 0)))
		return -1;
	/* registered now, after every constructor: it runs before their fork handlers */
	pthread_once(&fork_hook, resolve_all_before_fork);
	c->bell_fd = pair_end;          /* hidden, its send buffer sized (pairs.h) */
	c->sh->rcvtimeo_ms = 0;                 /* looked up when it is the pair's */
	c->pending_until_ms = mono_now_ms() + cfg.handshake_ms;
	atomic_store(&c->pending, PENDING_OPEN);
	fdv.bind_conn(c, cl->fd);
	fdv.add_flags(cl->fd, FDF_PENDING);
	DBG("connect fd %d: offer pending", cl->fd);
	/* a pending connection holds three descriptors: where they are short
	 * (fdview.h, budget_small), decide now and keep one */
	if (fdv.budget_small())
		hs_resolve(cl->fd, c, 0);
	conn_put(c);
	return 0;
}

/* The server took the offer: our end of the pair takes the descriptor's place. */
static void pending_take(int fd, struct conn *c)
{
	int fl = sys_fcntl(fd, F_GETFL, 0), fdfl = sys_fcntl(fd, F_GETFD, 0);

	c->sh->rcvtimeo_ms = fdv.copy_timeouts(fd, c->bell_fd) + 1;
	c->tcp_fd = io_keep_copy(fd, 0);
	sys_dup3(c->bell_fd, fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	fdv.release_kept(c->bell_fd);
	sys_close(c->bell_fd);
	c->bell_fd = -1;
	conn_note_bell(c, fd);
	if (fl & O_NONBLOCK)            /* options and flags set meanwhile went to the TCP socket */
		sys_fcntl(fd, F_SETFL, O_NONBLOCK);
	atomic_store(&c->sh->nonblock, (fl & O_NONBLOCK) != 0);
	conn_go_lean(c);
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
	socklen_t l = ep_to_sockaddr(&c->peer, (fdv.flags(fd) & FDF_INET6) ? AF_INET6 : AF_INET,
	                             &ss);
	int err = 0;
	socklen_t el = sizeof(err);

	c->direct = 0;
	if (sys_connect(fd, &ss, l) == 0)
		return 0;
	if (errno != EINPROGRESS || wait_fd(fd, POLLOUT, until) < 0)
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
	uint64_t n = c->sh->prod, done = 0;
	long until = mono_now_ms() + cfg.handshake_ms;

	if (c->direct && pending_connect(fd, c, until) < 0)
		n = 0;          /* nowhere to put them: the connection failed */
	while (done < n) {
		ssize_t k = sys_send(fd, data + done, (size_t)(n - done), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0)
			done += (uint64_t)k;
		else if ((k < 0 && errno != EAGAIN && errno != EINTR) ||
		         wait_fd(fd, POLLOUT, until) < 0)
			break;  /* the connection is gone, or nobody reads: as TCP would lose it */
	}
	sys_close(c->bell_fd);
	c->bell_fd = -1;
	c->mode = MODE_TCP;
	stats_slot_decide(totals, c->slot, MODE_TCP, reason);
	DBG("connect fd %d: tcp (%s), %llu bytes replayed", fd, reason_text(reason),
	    (unsigned long long)done);
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
	/* a read that may time out waits for the decision only: its own wait honours
	 * SO_RCVTIMEO (the decision comes within the handshake timeout) */
	if (reading && !fdv.may_have_timeouts(fd)) {
		int interrupted;
		w = offer_wait_reading(region_up(c->region),
		                       reading < c->rx_size ? (uint32_t)reading : c->rx_size,
		                       c->pending_until_ms, &interrupted);
		if (interrupted && w == OFFER_TAKEN)
			rx_note_interrupted();  /* for the read in the ring that follows */
	} else {
		w = offer_wait(region_up(c->region), c->pending_until_ms);
	}
	sh_lock(&c->sh->tx_lock);       /* no pending write is half done */
	if (w == OFFER_TAKEN)
		pending_take(fd, c);
	else
		pending_fall_back(fd, c, offer_reason(w));
	fdv.set_flags(fd, fdv.flags(fd) & ~FDF_PENDING);
	atomic_store(&c->pending, PENDING_NONE);
	sh_unlock(&c->sh->tx_lock);
}

void hs_resolve_fd(int fd)
{
	struct conn *c;

	if (!(fdv.flags(fd) & FDF_PENDING) || sys_in_vfork_child() || !(c = fdv.get_conn(fd)))
		return;         /* a vfork child would decide in its parent's memory */
	if (atomic_load(&c->pending) != PENDING_NONE)
		hs_resolve(fd, c, 0);
	conn_put(c);
}

static void resolve_one(int fd, struct conn *c, void *arg)
{
	if (atomic_load(&c->pending) != PENDING_NONE)
		hs_resolve(fd, c, 0);
}

/* A child must not inherit an undecided connection: decide them all first. */
void hs_resolve_all(void)
{
	fdv.for_each_conn(resolve_one, NULL);
}

static void resolve_all_before_fork(void)
{
	pthread_atfork(hs_resolve_all, NULL, NULL);
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

	if (offer_prepare(cl, &p, pair, fds, &m, CLC_OFFER) < 0 ||
	    offer_send(cl, cl->listener.offer.inbox, &m, fds, pair, &p) < 0)
		return -1;
	*rc = client_tcp_connect(cl, sa, len, &timed_out);
	e = errno;
	if (*rc == 0 && client_pending(cl, pair[0], &p) == 0)
		return 0;
	/* a connect that failed outright reached no server: nobody can take it */
	w = *rc == 0 || timed_out ? offer_wait(region_up(p.region), mono_now_ms() + cfg.handshake_ms) :
	    offer_withdraw(region_up(p.region));
	ep_of_socket(cl->fd, 0, &cl->src);
	if (w == OFFER_TAKEN) {
		DBG("connect fd %d: shm through the inbox (ring tx %u rx %u)", cl->fd, p.up, p.down);
		client_install(cl, pair[0], &p);
		*rc = 0;
		return 0;
	}
	sys_close(pair[0]);
	parts_free(&p);
	if (*rc == 0 || timed_out)
		client_fallback(cl, offer_reason(w));
	errno = e;
	return 0;
}

/*
 * A direct connection has an address of its own, as TCP's would: the
 * socket is bound to the destination's address (a local one) and an
 * ephemeral port, unless the application bound it.
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
	l = ep_to_sockaddr(&here, (fdv.flags(cl->fd) & FDF_INET6) ? AF_INET6 : AF_INET, &ss);
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
	if (!(fdv.flags(cl->fd) & FDF_KNOWN) || direct_bind(cl) < 0 ||
	    offer_prepare(cl, &p, pair, fds, &m, CLC_DIRECT) < 0)
		return -1;
	memcpy(m.direct.dst_ip, cl->dst.ip, sizeof(m.direct.dst_ip));
	m.direct.dst_port = cl->dst.port;
	if (offer_send(cl, cl->listener.offer.direct, &m, fds, pair, &p) < 0)
		return -1;
	if (client_pending(cl, pair[0], &p) == 0)
		return 0;
	/* no memory for the connection: a server that took it sees the pair hang up */
	offer_withdraw(region_up(p.region));
	sys_close(pair[0]);
	parts_free(&p);
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
		if (cl.listener.offer.direct && cfg.direct && client_direct(&cl) == 0)
			return 0;
		if (client_offer(&cl, sa, len, &rc) == 0)
			return rc;
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

/* ---- server side -------------------------------------------------------- */

struct server {
	int fd;                 /* accepted TCP socket (-1: direct) */
	int lfd;                /* direct: the listener */
	int direct;             /* a direct offer: no TCP connection */
	struct ep listen_addr;  /* direct: what the listener is bound to */
	int flags;              /* accept4() flags */
	struct ep local, peer;
	uint64_t netns;
	char key[96];
	int rendezvous;         /* O_PATH descriptor of the client's p/<key> */
	uint64_t nonce;
	int s;                  /* our end of the socket pair, or -1 */
};

/* One unbound datagram socket per process sends every ACCEPT and DECLINE. */
static _Atomic int answer_sock = -1;

static int answer_sock_get(void)
{
	int s = atomic_load(&answer_sock), mine, none = -1;

	if (s >= 0)
		return s;
	mine = sys_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (mine < 0)
		return -1;
	mine = io_keep_fd(mine);
	if (atomic_compare_exchange_strong(&answer_sock, &none, mine))
		return mine;
	sys_close(mine);        /* another thread was first */
	return none;
}

/* Send @m with @fds to the client's rendezvous socket. */
static int server_send(struct server *sv, const union clc_msg *m, const int *fds, int nfds)
{
	struct clc_out o;
	int s = answer_sock_get();

	if (s < 0)
		return -1;
	return registry_rendezvous_send(sv->rendezvous, s, clc_prepare(&o, m, fds, nfds)) ==
	       (ssize_t)m->hdr.length ? 0 : -1;
}

static int server_precheck(void)
{
	if (io_uring_in_use())
		return R_IO_URING;
	if (conn_count() >= cfg.max_conns)
		return R_MAX_BUFFERS;
	return R_NONE;
}

/* Send ACCEPT; on success sv->s is our end of the pair. */
static int server_offer(struct server *sv, struct shm_parts *p)
{
	static _Atomic uint64_t nonces;
	/* both ends start blocking: the client's end then needs no fcntl */
	int type = SOCK_SEQPACKET | (sv->flags & SOCK_CLOEXEC);
	union clc_msg m;
	int pair[2], fds[2], rc;

	if (!(p->sh = conn_shared_new()))
		return R_NO_MEMORY;
	if (sys_socketpair(AF_UNIX, type, 0, pair) < 0)
		return R_HANDSHAKE_ERROR;
	sv->nonce = atomic_fetch_add(&nonces, 1) + 1;
	clc_init(&m, CLC_ACCEPT, sv->nonce);
	m.accept.pid = (uint32_t)sys_getpid();
	m.accept.ring_size = cfg.tx_size;
	m.accept.rx_max = cfg.rx_max;
	m.accept.netns = sv->netns;
	fds[0] = pair[1];
	fds[1] = sv->fd;
	rc = server_send(sv, &m, fds, 2);
	sys_close(pair[1]);
	if (rc < 0) {
		sys_close(pair[0]);
		return R_PEER_WITHDREW;
	}
	sv->s = pair[0];
	return R_NONE;
}

/* CONFIRM arrived: check the client's region and take it. */
static int server_take(struct server *sv, const union clc_msg *m, int region_fd, int tcp_fd,
                       struct shm_parts *p)
{
	uid_t owner;

	if (!proof_ok(&sv->local, &sv->peer, sv->netns, tcp_fd))
		return R_PROOF_FAILED;
	p->up = m->accept.ring_size;
	p->down = m->accept.rx_max;
	/* sizes the client chose within what we offered */
	if (p->up > cfg.rx_max || p->down > cfg.tx_size ||
	    !(p->region = region_map(region_fd, p->up, p->down, &owner)))
		return R_HANDSHAKE_ERROR;
	/* the pid in CONFIRM is the client's word, in its own PID namespace */
	region_note_maker(p->region, 0);
	return config_uid_allowed(&cfg, owner) ? R_NONE : R_DIFF_USER;
}

/*
 * Wait for CONFIRM or DECLINE.  A CONFIRM that fails our checks comes from a
 * client that does not follow the protocol, or we could not map its region
 * (out of memory); we stay on TCP and close the pair, so that client sees
 * its connection hang up, as after a reset.
 */
static int server_wait_confirm(struct server *sv, struct shm_parts *p)
{
	union clc_msg m;
	int fds[2], reason;

	long deadline = mono_now_ms() + cfg.handshake_ms;

	if (msg_recv(sv->s, CLC_CONFIRM, sv->nonce, &m, fds, 2, deadline) < 0) {
		/* before the deadline: the client hung up its end, it gave up */
		int gave_up = mono_now_ms() < deadline ? R_PEER_WITHDREW : R_TIMEOUT;
		/* close the door, then a last look (see top of file) */
		sys_shutdown(sv->s, SHUT_RD);
		if (msg_recv(sv->s, CLC_CONFIRM, sv->nonce, &m, fds, 2, 0) < 0)
			return gave_up;
	}
	if (m.hdr.type == CLC_DECLINE)
		return (int)m.decline.reason;
	reason = server_take(sv, &m, fds[0], fds[1], p);
	sys_close_all(fds, 2);
	return reason;
}

static int server_fallback(struct server *sv, int reason)
{
	DBG("accept fd %d: tcp (%s)", sv->fd, reason_text(reason));
	conn_tcp(sv->fd, ROLE_SERVER, reason, &sv->local, &sv->peer);
	return sv->fd;
}

/* Tell a waiting client no, so it need not wait out its timeout. */
static int server_decline(struct server *sv, int reason)
{
	union clc_msg m;

	decline_init(&m, 0, reason);
	server_send(sv, &m, NULL, 0);
	return server_fallback(sv, reason);
}

/*
 * The handshake is won: our end of the pair becomes the application's fd.
 * Family and timeouts are the accepted socket's - a direct connection's are
 * the listener's, which an accepted socket inherits.
 */
static int server_install(struct server *sv, struct shm_parts *p)
{
	int model = sv->direct ? sv->lfd : sv->fd, tcp = -1;
	int domain = domain_of(model);

	DBG("accept fd %d: shm (ring tx %u rx %u)%s", sv->s, p->down, p->up,
	    sv->direct ? " without TCP" : "");
	p->rcvtimeo_ms = fdv.copy_timeouts(model, sv->s);
	p->direct = sv->direct;
	if (sv->flags & SOCK_NONBLOCK)  /* every pair end comes blocking, as its maker made it */
		sys_fcntl(sv->s, F_SETFL, O_NONBLOCK);
	if (!sv->direct) {
		fdv.set_flags(sv->fd, 0);
		tcp = io_keep_fd(sv->fd);
	}
	conn_shm(sv->s, tcp, ROLE_SERVER, p, &sv->local, &sv->peer, domain,
	         (sv->flags & SOCK_NONBLOCK) != 0);
	return sv->s;
}

/* Everything after the client showed up at its rendezvous; returns the application's fd. */
static int server_handshake(struct server *sv)
{
	struct shm_parts parts = { 0 };
	int reason = server_precheck();

	if (reason != R_NONE)
		return server_decline(sv, reason);
	reason = server_offer(sv, &parts);
	if (reason == R_NONE)
		reason = server_wait_confirm(sv, &parts);
	if (reason != R_NONE) {
		if (sv->s >= 0)
			sys_close(sv->s);
		parts_free(&parts);
		return server_fallback(sv, reason);
	}
	return server_install(sv, &parts);
}

/* ---- server side: an offer from our inbox (inbox.h) --------------------- */

/* A direct offer's proof: the client's own TCP socket, bound (its address
 * is the peer's) in our namespace, and a destination our listener covers. */
static int proof_direct(struct server *sv, int theirs)
{
	return sock_is_tcp(theirs) && netns_cookie(theirs) == sv->netns &&
	       ep_of_socket(theirs, 0, &sv->peer) == 0 && sv->peer.port != 0 &&
	       sv->local.port == sv->listen_addr.port && ep_covers(&sv->listen_addr, &sv->local, 0);
}

/* Is @s a socket pair end (AF_UNIX, SOCK_SEQPACKET) made by a user we may attach to? */
static int offer_pair_check(int s, struct region *r)
{
	pid_t maker;
	int v = 0;
	socklen_t l = sizeof(v);

	if (sys_getsockopt(s, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0 || v != AF_UNIX)
		return R_HANDSHAKE_ERROR;
	l = sizeof(v);
	if (sys_getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &l) < 0 || v != SOCK_SEQPACKET)
		return R_HANDSHAKE_ERROR;
	if ((maker = peer_pid_allowed(s)) < 0)
		return R_DIFF_USER;
	region_note_maker(r, maker);    /* the client made the pair, as the region */
	return R_NONE;
}

/*
 * Check the offer and map its region into @p.  Returns the reason to
 * decline, R_NONE to take it; p->region is NULL if the client cannot even
 * be told (it then withdraws when its wait ends).
 */
static int offer_check(struct server *sv, const union clc_msg *m, const int fds[OFFER_FDS],
                       struct shm_parts *p)
{
	int reason = server_precheck();
	uid_t owner;

	p->up = m->accept.ring_size;
	p->down = m->accept.rx_max;
	if (p->up > cfg.rx_max || p->down > cfg.tx_size ||
	    !(p->region = region_map(fds[OFFER_FD_REGION], p->up, p->down, &owner)))
		return R_HANDSHAKE_ERROR;
	if (reason != R_NONE)
		return reason;
	if (!config_uid_allowed(&cfg, owner))
		return R_DIFF_USER;
	if ((reason = offer_pair_check(fds[OFFER_FD_PAIR], p->region)) != R_NONE)
		return reason;
	/* inbox_take matched its addresses to this connection already */
	if (!(sv->direct ? proof_direct(sv, fds[OFFER_FD_TCP]) :
	      proof_same_host(&sv->local, sv->netns, fds[OFFER_FD_TCP])))
		return R_PROOF_FAILED;
	if (!(p->sh = conn_shared_new()))
		return R_NO_MEMORY;
	return R_NONE;
}

static int server_take_offer(struct server *sv, const union clc_msg *m, int fds[OFFER_FDS])
{
	struct shm_parts p = { 0 };
	int reason;

	if (!sv->direct)
		sv->netns = netns_cookie(sv->fd);
	reason = offer_check(sv, m, fds, &p);
	if (p.region && offer_decide(region_up(p.region), reason == R_NONE ? OFFER_TAKEN :
	                             OFFER_DECLINED | (uint32_t)reason << 8) < 0)
		reason = R_PEER_WITHDREW;       /* the client gave up first */
	sys_close(fds[OFFER_FD_TCP]);
	sys_close(fds[OFFER_FD_REGION]);
	if (reason != R_NONE) {
		sys_close(fds[OFFER_FD_PAIR]);
		parts_free(&p);
		/* a direct offer leaves no connection behind: the client connects over TCP */
		return sv->direct ? -1 : server_fallback(sv, reason);
	}
	if (totals)
		atomic_fetch_add_explicit(&totals->inbox_handshakes, 1, memory_order_relaxed);
	if (totals && sv->direct)
		atomic_fetch_add_explicit(&totals->direct_handshakes, 1, memory_order_relaxed);
	sv->s = fds[OFFER_FD_PAIR];
	/* it came with MSG_CMSG_CLOEXEC; the application asked for what accept4 says */
	if (!(sv->flags & SOCK_CLOEXEC))
		sys_fcntl(sv->s, F_SETFD, 0);
	return server_install(sv, &p);
}

/* ---- server side: the direct handshake (connections without TCP) ------- */

/*
 * A blocking listener goes direct once an accept() on it took an smclo
 * client's offer: its process waits in accept(), so accept() can wait on
 * the listener and on a direct inbox of the listener's own together, and
 * the client need not make a TCP connection to wake it (design.md §2d).
 * The listener's entry is made again,
 * naming that inbox; clients that see it send a CLC_DIRECT offer there and
 * no SYN.  Anything that waits for the listener where accept() cannot see
 * (epoll, poll, select), makes it non-blocking or gives it a receive
 * timeout takes it back to TCP for good (hs_listener_no_direct): its entry
 * is made again without the inbox, and offers queued there are declined so
 * their clients connect over TCP at once.
 */

static int listener_register(int fd, const struct listener_offer *offer);

/* A new entry for listener @fd naming @direct (0: none) replaces its entry. */
static int listener_reregister(int fd, uint64_t direct)
{
	struct listener_offer offer = { .inbox = inbox_id(), .direct = direct,
	                                .tx_size = cfg.tx_size, .rx_max = cfg.rx_max };
	int lock = offer.inbox ? listener_register(fd, &offer) : -1, old;

	if (lock < 0)
		return -1;
	old = fdv.take_listen_lock(fd);
	fdv.set_listen_lock(fd, lock);
	if (old >= 0)
		registry_lock_remove(registry_fd, "l", old);
	return 0;
}

/*
 * Threads inside accept()'s kernel wait on a listener, or about to enter
 * it, are counted in its descriptor's entry.  Such a thread would not see a
 * direct offer, and a client whose offer nobody sees waits out its
 * handshake timeout; so a listener goes direct only while none is there.
 * The waiter counts itself before it looks at FDF_DIRECT, the switch sets
 * FDF_DIRECT before it looks at the count (both sequentially consistent):
 * one of them sees the other.
 */
void hs_kernel_accept(int lfd, int delta)
{
	fdv.kernel_accepts(lfd, delta);
	atomic_thread_fence(memory_order_seq_cst);
}

static int kernel_accepts(int lfd)
{
	return fdv.kernel_accepts(lfd, 0);
}

/* An offer queued when the listener went back to TCP: its client connects over TCP now. */
static void direct_refuse(const union clc_msg *m, int fds[OFFER_FDS])
{
	struct region *r = NULL;
	uid_t owner;

	if (m->accept.ring_size <= cfg.rx_max && m->accept.rx_max <= cfg.tx_size)
		r = region_map(fds[OFFER_FD_REGION], m->accept.ring_size, m->accept.rx_max, &owner);
	if (r) {
		offer_decide(region_up(r), OFFER_DECLINED | (uint32_t)R_DIRECT_ENDED << 8);
		region_put(r, 0);
	}
	sys_close_all(fds, OFFER_FDS);
}

/* Listener @fd takes connections through TCP again. */
static void listener_leave_direct(int fd)
{
	listener_reregister(fd, 0);
	fdv.set_flags(fd, fdv.flags(fd) & ~FDF_DIRECT);
	inbox_direct_close(fd, direct_refuse);
	DBG("listen fd %d: back to TCP only", fd);
}

/*
 * Going direct and back are rare and a few system calls each; one lock
 * orders them, so a listener that is polled while another thread makes it
 * direct ends up back on TCP, never both.
 */
static pthread_mutex_t direct_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void direct_init(void)
{
	fork_guard(&direct_lock);
}

/* Make blocking listener @lfd direct, or mark it never to be (lock held). */
static void listener_go_direct_locked(int lfd)
{
	struct timeval tv = { 0 };
	socklen_t l = sizeof(tv);
	int fl;
	struct ep addr;
	uint64_t id;

	if ((fdv.flags(lfd) & (FDF_LISTENING | FDF_DIRECT | FDF_NO_DIRECT)) != FDF_LISTENING ||
	    server_precheck() != R_NONE || kernel_accepts(lfd) > 0)
		return;         /* not now (io_uring, too many connections, another thread
		                   waits in the kernel), or decided already */
	fl = sys_fcntl(lfd, F_GETFL, 0);
	if (!cfg.direct || fl < 0 || (fl & O_NONBLOCK) ||
	    sys_getsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) < 0 || tv.tv_sec || tv.tv_usec ||
	    ep_of_socket(lfd, 0, &addr) < 0)
		goto never;
	if (!(id = inbox_direct_open(lfd, &addr, netns_cookie(lfd))))
		goto never;
	if (listener_reregister(lfd, id) < 0) {
		inbox_direct_close(lfd, direct_refuse);
		goto never;
	}
	fdv.add_flags(lfd, FDF_DIRECT);
	if (kernel_accepts(lfd) > 0) {         /* one came meanwhile: not now */
		listener_leave_direct(lfd);
		return;
	}
	DBG("listen fd %d: takes connections without TCP (direct inbox %llx)", lfd,
	    (unsigned long long)id);
	return;
never:
	fdv.add_flags(lfd, FDF_NO_DIRECT);
}

/*
 * After listener @lfd took an smclo client's offer: the next ones may come
 * without TCP.  Only then, so a server of plain clients never pays the
 * poll() a direct accept() makes.
 */
static void listener_go_direct(int lfd)
{
	if ((fdv.flags(lfd) & (FDF_LISTENING | FDF_DIRECT | FDF_NO_DIRECT)) != FDF_LISTENING)
		return;
	pthread_mutex_lock(&direct_lock);
	listener_go_direct_locked(lfd);
	pthread_mutex_unlock(&direct_lock);
}

void hs_listener_no_direct(int fd)
{
	uint16_t f = fdv.flags(fd);

	if (!(f & FDF_LISTENING) || (f & FDF_NO_DIRECT))
		return;
	pthread_mutex_lock(&direct_lock);
	fdv.add_flags(fd, FDF_NO_DIRECT);
	if (fdv.flags(fd) & FDF_DIRECT)
		listener_leave_direct(fd);
	pthread_mutex_unlock(&direct_lock);
}

/* The next direct offer in @dsock taken: the application's fd, or -1 when none is queued. */
static int direct_take_next(int lfd, int dsock, const struct ep *addr, uint64_t netns,
                            int flags, struct ep *peer)
{
	struct server sv;
	union clc_msg m;
	int fds[OFFER_FDS], fd = -1;

	do {
		if (clc_recv(dsock, CLC_DIRECT, 0, &m, fds, OFFER_FDS) < 0) {
			if (errno == EPROTO)
				continue;       /* not an offer: dropped, descriptors closed */
			return -1;
		}
		sv = (struct server){ .fd = -1, .lfd = lfd, .direct = 1, .flags = flags, .s = -1,
		                      .netns = netns, .listen_addr = *addr };
		memcpy(sv.local.ip, m.direct.dst_ip, sizeof(sv.local.ip));
		sv.local.port = m.direct.dst_port;
		fd = server_take_offer(&sv, &m, fds);
	} while (fd < 0);
	*peer = sv.peer;
	return fd;
}

int hs_accept_direct(int lfd, int flags, struct ep *peer)
{
	for (;;) {
		struct ep addr;
		uint64_t netns;
		int dsock = inbox_direct_sock(lfd, &addr, &netns), fd;
		struct pollfd p[2] = { { .fd = lfd, .events = POLLIN },
		                       { .fd = dsock, .events = POLLIN } };

		if (dsock < 0)
			return HS_ACCEPT_KERNEL;        /* back to TCP meanwhile */
		/* as accept() would sleep: a restarting signal goes on, any other ends it */
		if (sys_poll(p, 2, -1) < 0) {
			if (errno == EINTR && bell_signals_restart())
				continue;
			return -1;
		}
		/* the inbox first: what the kernel queued stays queued */
		if (p[1].revents &&
		    (fd = direct_take_next(lfd, dsock, &addr, netns, flags, peer)) >= 0)
			return fd;
		if (p[0].revents)
			return HS_ACCEPT_KERNEL;
	}
}

int hs_accept(int lfd, int fd, int flags, const struct sockaddr *peer, socklen_t peer_len)
{
	struct server sv = { .fd = fd, .flags = flags, .s = -1 };
	uid_t owner;
	int rc;

	if (ep_from_sockaddr(&sv.peer, peer, peer_len) < 0)
		return fd;                      /* not an IP socket */
	if (!(fdv.flags(lfd) & FDF_LISTENING))
		hs_listen(lfd);                 /* inherited listener: announce it now */
	/* accept() gives addresses in the socket's own family */
	fdv.set_flags(fd, FDF_TCP | FDF_KNOWN | (peer->sa_family == AF_INET6 ? FDF_INET6 : 0) |
	             ((fdv.flags(lfd) & (FDF_KNOWN | FDF_TIMEOUTS)) != FDF_KNOWN ? FDF_TIMEOUTS : 0));
	if (registry_fd < 0)
		return server_fallback(&sv, R_NO_REGISTRY);
	/*
	 * A plain client (nothing in the inbox, nobody at a rendezvous): the
	 * local address is not asked of the kernel, a system call per
	 * connection (~1% of a connection's CPU beside busy loops) for a column
	 * of `smclo stat` ("-").
	 */
	if (!inbox_may_hold_offer() && !registry_rendezvous_any(registry_fd))
		return server_fallback(&sv, R_PEER_NO_SMCLO);
	if (ep_of_socket(fd, 0, &sv.local) < 0)
		return server_fallback(&sv, R_PEER_NO_SMCLO);
	{
		union clc_msg m;
		int fds[OFFER_FDS];
		if (inbox_take(&sv.local, &sv.peer, &m, fds) == 0) {
			rc = server_take_offer(&sv, &m, fds);
			/* a client we took: the next ones need no TCP.  Not after a
			 * decline: its TCP connection would reach us without an offer,
			 * and the reason would read peer-no-smclo here */
			if (sv.s >= 0)
				listener_go_direct(lfd);
			return rc;
		}
	}
	if (!registry_rendezvous_any(registry_fd))
		return server_fallback(&sv, R_PEER_NO_SMCLO);   /* no client waits under p/ */
	registry_rendezvous_key(sv.key, sizeof(sv.key), &sv.local, sv.peer.port);
	sv.rendezvous = registry_rendezvous_open(registry_fd, sv.key, &owner);
	if (sv.rendezvous < 0)
		return server_fallback(&sv, R_PEER_NO_SMCLO);
	sv.netns = netns_cookie(fd);
	/* our TCP socket goes there: only to a user we may attach to */
	rc = config_uid_allowed(&cfg, owner) ? server_handshake(&sv) :
	     server_decline(&sv, R_DIFF_USER);
	sys_close(sv.rendezvous);
	return rc;
}

/* ---- listeners ---------------------------------------------------------- */

int hs_listen_bound(int fd)
{
	struct ep e;

	if (ep_of_socket(fd, 0, &e) < 0 || e.port == 0)
		return -1;
	hs_listen(fd);
	return (fdv.flags(fd) & FDF_LISTENING) ? 0 : -1;
}

/* An entry for listener @fd naming @offer; returns its (hidden) lock, or -1. */
/*
 * This process is about to become a user who cannot use the registry (a
 * daemon dropping root after listen(), as nginx's workers do): while it
 * still can, every listener entry of its own says so, and clients use TCP
 * at once (no-registry) instead of waiting out their handshake timeout at
 * a rendezvous nobody here can see.
 */
static int registry_unreachable;

static void listener_mark_unreachable(int fd)
{
	struct listener_offer none = { 0 };
	int lock, old;

	if (fdv.flags(fd) & FDF_DIRECT)
		listener_leave_direct(fd);
	hs_listener_no_direct(fd);
	if ((lock = listener_register(fd, &none)) < 0)
		return;
	old = fdv.take_listen_lock(fd);
	fdv.set_listen_lock(fd, lock);
	if (old >= 0)
		registry_lock_remove(registry_fd, "l", old);
}

static void listeners_unreachable(const char *why)
{
	if (registry_fd < 0 || registry_unreachable)
		return;
	registry_unreachable = 1;
	fdv.for_each_listener(listener_mark_unreachable);
	DBG("%s: listeners marked for TCP", why);
}

void hs_user_changing(uid_t euid)
{
	if (euid != (uid_t)-1 && euid != geteuid() && !registry_usable_by(euid))
		listeners_unreachable("the new effective uid cannot use the registry");
}

/*
 * After chroot(): a server answers a client's rendezvous through the path
 * /proc/self/fd/N/p/<key>, which a root without /proc does not have (the
 * inbox and direct handshakes need no path, but clients cannot tell which
 * they will get).  The entries are made again while the registry
 * directory, opened before, still takes them.
 */
void hs_chrooted(void)
{
	if (access("/proc/self/fd", X_OK) < 0)
		listeners_unreachable("no /proc in the new root");
}

static int listener_register(int fd, const struct listener_offer *offer)
{
	struct ep e;
	unsigned flags = 0;
	int v = 0, lock;
	socklen_t l = sizeof(v);

	if (registry_fd < 0 || ep_of_socket(fd, 0, &e) < 0)
		return -1;
	if (sys_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, &l) == 0 && v)
		flags |= LISTEN_F_V6ONLY;
	v = 0;
	l = sizeof(v);
	if (sys_getsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, &l) == 0 && v)
		flags |= LISTEN_F_DEFER;
	if (registry_unreachable)
		flags |= LISTEN_F_UNREACHABLE;
	lock = registry_listener_add(registry_fd, &e, netns_cookie(fd), flags, offer);
	if (lock >= 0)
		DBG("listen fd %d: registered port %u, inbox %llx", fd, e.port,
		    (unsigned long long)offer->inbox);
	return lock < 0 ? -1 : io_keep_fd(lock);
}

void hs_listen(int fd)
{
	struct listener_offer offer = { .inbox = inbox_id(), .tx_size = cfg.tx_size,
	                                .rx_max = cfg.rx_max };
	int lock;
	uint16_t f = fdv.flags(fd);

	/*
	 * A server that can make neither an inbox nor the socket it answers
	 * rendezvous through (out of descriptors) could not take a client:
	 * unannounced, its clients use TCP at once instead of waiting.
	 */
	if (!offer.inbox && answer_sock_get() < 0)
		return;
	lock = listener_register(fd, &offer);
	if (lock < 0)
		return;
	fdv.set_listen_lock(fd, lock);
	if (!(f & FDF_KNOWN) && domain_of(fd) == AF_INET6)
		f |= FDF_INET6;         /* inherited: asked once, here */
	if (!(f & FDF_KNOWN))
		f |= FDF_TIMEOUTS;      /* and whatever options it came with, not known */
	fdv.set_flags(fd, FDF_TCP | FDF_KNOWN | FDF_LISTENING |
	             (f & (FDF_SMC | FDF_INET6 | FDF_TIMEOUTS | FDF_NO_DIRECT)));
}

/*
 * A fork child may accept on every listener it inherited: it adds an entry
 * of its own, without an inbox, so clients see that more than one process
 * accepts there and use the rendezvous.  The entry lives as long as the
 * child holds the listener: across exec too when the listener survives it.
 */
static void listener_forked(int fd)
{
	struct listener_offer none = { 0 };
	int old = fdv.take_listen_lock(fd), lock = listener_register(fd, &none);

	if (old >= 0)
		sys_close(old);
	/* the parent's direct inbox is not the child's (inbox.c drops the copy) */
	fdv.set_flags(fd, (fdv.flags(fd) & ~FDF_DIRECT) | FDF_NO_DIRECT);
	if (lock < 0)
		return;
	if (!(sys_fcntl(fd, F_GETFD, 0) & FD_CLOEXEC))
		sys_fcntl(lock, F_SETFD, 0);
	fdv.set_listen_lock(fd, lock);
}

void hs_after_fork(void)
{
	fdv.for_each_listener(listener_forked);
}

void hs_listener_closed(int fd)
{
	int lock = fdv.take_listen_lock(fd);

	/* a fork child holds an entry of its own (listener_forked) */
	if (lock >= 0)
		sys_close(lock);
	pthread_mutex_lock(&direct_lock);
	if (fdv.flags(fd) & FDF_DIRECT)
		inbox_direct_close(fd, direct_refuse);
	fdv.set_flags(fd, fdv.flags(fd) & ~(FDF_LISTENING | FDF_DIRECT));
	pthread_mutex_unlock(&direct_lock);
}
