/*
 * handshake.c - the switch from TCP to shared memory (the kernel's CLC).
 *
 *   client connect()                        server accept()
 *   ----------------                        ---------------
 *   find a live smclo listener for dst
 *   bind to learn the source port
 *   PROPOSAL file p/<tuple>   (before SYN)
 *   TCP connect  ------------------------>  kernel accepts the TCP connection
 *   wait on our side socket                 p/<tuple> exists? no: plain TCP
 *                                           claim it: rename -> <tuple>.c
 *                      <--------- ACCEPT    connect to the client's side socket
 *                                 (ring, TCP socket as proof)
 *   check proof, map ring
 *   CONFIRM ------------------------------> check proof, map ring
 *   (ring, TCP socket as proof)             decide: rename .c -> .ok
 *                      <---------- FINAL
 *   app fd := side connection               return the side connection
 *
 * No byte is ever sent in-band: a peer without smclo never sees anything but
 * an ordinary TCP connection.  The connection is decided once, by renames the
 * filesystem makes atomic (claim, withdraw, decide ok/tcp), so a side that
 * times out can never disagree with the other.  Both waits are bounded by
 * SMCLO_HANDSHAKE_MS.  The client stays inside connect() and the server
 * inside accept() until the decision, so the descriptor is switched before
 * the application can have put it into an epoll set, and nothing has been
 * written to it yet: a fallback loses nothing.
 *
 * Same-connection proof: each side hands the other its TCP socket.  The
 * receiver checks that the addresses are mirror images and that both sockets
 * live in one network namespace (where the kernel keeps the 4-tuple unique),
 * or, across namespaces, that the client reached a non-loopback address.
 * The kernel vouches for descriptors and for SO_PEERCRED; nothing rests on a
 * random identifier.
 */
#include "handshake.h"

#include "clc.h"
#include "config.h"
#include "conn.h"
#include "io.h"
#include "log.h"
#include "registry.h"
#include "sockopt.h"
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

#define SIDE_SNDBUF 6500    /* kernel doubles it: ~4 doorbells writable, ~17 to full */

/* ---- small helpers ------------------------------------------------------ */

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static uint64_t random_nonce(void)
{
	uint64_t v = 0;

	while (v == 0 && syscall(SYS_getrandom, &v, sizeof(v), 0) == sizeof(v))
		;
	return v ? v : (uint64_t)now_ms() ^ ((uint64_t)getpid() << 32);
}

static uint64_t netns_cookie(int fd)
{
	uint64_t c = 0;
	socklen_t l = sizeof(c);

	sys_getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &c, &l);
	return c;
}

static int sock_ep(int fd, int peer, struct ep *e)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	int rc = peer ? sys_getpeername(fd, &ss, &l) : sys_getsockname(fd, &ss, &l);

	return rc < 0 ? -1 : ep_from_sockaddr(e, (struct sockaddr *)&ss, l);
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
	long now = now_ms();
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
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		long left = deadline - now_ms();
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

/* ---- handshake messages over the side connection ------------------------ */

static int msg_send(int s, const union clc_msg *m, const int *fds, int nfds)
{
	char cbuf[CMSG_SPACE(2 * sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = (void *)m, .iov_len = m->hdr.length };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds) {
		struct cmsghdr *cm;
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	return sys_sendmsg(s, &mh, MSG_NOSIGNAL) == (ssize_t)m->hdr.length ? 0 : -1;
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			sys_close(fds[i]);
}

/*
 * Receive one message of @type (or DECLINE) for @nonce with exactly @want
 * descriptors (none for DECLINE).  Returns 0, or -1 on timeout, hang-up or
 * anything malformed; descriptors are closed on failure.
 */
static int msg_recv(int s, enum clc_type type, uint64_t nonce, union clc_msg *m,
                    int *fds, int want, long deadline)
{
	char buf[sizeof(union clc_msg) + 8];
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
	                     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	int got[4], ngot = 0;
	ssize_t n;

	if (wait_fd(s, POLLIN, deadline) < 0)
		return -1;
	n = sys_recvmsg(s, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k && ngot < 4; i++)
			memcpy(&got[ngot++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	if ((mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) ||
	    clc_parse(buf, (size_t)n, type, nonce, m) < 0 ||
	    ngot != (m->hdr.type == CLC_DECLINE ? 0 : want)) {
		close_fds(got, ngot);
		return -1;
	}
	memcpy(fds, got, ngot * sizeof(int));
	return 0;
}

static void send_decline(int s, uint64_t nonce, int reason)
{
	union clc_msg m;

	clc_init(&m, CLC_DECLINE, nonce);
	m.decline.reason = (uint32_t)reason;
	msg_send(s, &m, NULL, 0);
}

static int peer_uid_ok(int s)
{
	struct ucred cr;
	socklen_t l = sizeof(cr);

	return sys_getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 &&
	       config_uid_allowed(&cfg, cr.uid);
}

/* Is @theirs the other end of our TCP socket @mine?  (see top of file) */
static int proof_ok(int mine, int theirs)
{
	struct ep ml, mp, tl, tp;

	if (!sock_is_tcp(theirs) || sock_ep(mine, 0, &ml) || sock_ep(mine, 1, &mp) ||
	    sock_ep(theirs, 0, &tl) || sock_ep(theirs, 1, &tp))
		return 0;
	if (!ep_equal(&ml, &tp) || !ep_equal(&mp, &tl))
		return 0;
	if (netns_cookie(mine) == netns_cookie(theirs))
		return 1;
	return cfg.cross_netns && !ep_is_loopback(&ml);
}

/* ---- the per-thread side socket the server connects to ------------------ */

static __thread int side_fd = -1;
static __thread pid_t side_pid;
static __thread char side_name[CLC_SIDE_MAX];
static pthread_key_t side_key;
static pthread_once_t side_once = PTHREAD_ONCE_INIT;

static void side_destroy(void *unused)
{
	char path[160];

	if (side_fd >= 0 && side_pid == getpid()) {
		snprintf(path, sizeof(path), "s/%s", side_name);
		unlinkat(registry_fd, path, 0);
		sys_close(side_fd);
	}
	side_fd = -1;
}

static void side_key_init(void)
{
	pthread_key_create(&side_key, side_destroy);
}

static int side_get(void)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	char table[40];
	int fd;

	if (side_fd >= 0 && side_pid == getpid())
		return side_fd;
	side_fd = -1;    /* inherited through fork: the parent's, not ours */
	if (!stats_table(registry_fd, table, sizeof(table)))
		return -1;
	snprintf(side_name, sizeof(side_name), "%s-%ld", table, (long)syscall(SYS_gettid));
	if (registry_sun_path(registry_fd, "s", side_name, sun.sun_path, sizeof(sun.sun_path)) < 0)
		return -1;
	fd = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	unlink(sun.sun_path);    /* a stale one from a thread id reused */
	if (sys_bind(fd, &sun, sizeof(sun)) < 0 || sys_listen(fd, 64) < 0) {
		sys_close(fd);
		return -1;
	}
	side_fd = fd_hide(fd);
	side_pid = getpid();
	pthread_once(&side_once, side_key_init);
	pthread_setspecific(side_key, &side_fd);
	return side_fd;
}

void hs_after_fork(void)
{
	side_fd = -1;
	stats_forget_table();
}

/* ---- connection objects ------------------------------------------------- */

static struct conn *conn_tcp(int fd, int role, int reason, const struct ep *l,
                             const struct ep *p, int domain)
{
	struct conn *c = conn_alloc(MODE_TCP);

	if (!c)
		return NULL;
	c->domain = domain;
	c->local = *l;
	c->peer = *p;
	c->slot = stats_slot_alloc(stats_table(registry_fd, NULL, 0), fd, role);
	if (c->slot) {
		c->slot->local = *l;
		c->slot->peer = *p;
	}
	stats_slot_decide(totals, c->slot, MODE_TCP, reason);
	conn_bind_fd(c, fd);
	conn_put(c);
	return c;
}

struct shm_parts {
	struct ring_hdr *tx;
	const struct ring_hdr *rx;
	uint32_t tx_size, rx_size;
	struct conn_shared *sh;
	int tx_memfd;
};

static void parts_free(struct shm_parts *p)
{
	if (p->tx)
		munmap(p->tx, ring_region_len(p->tx_size));
	if (p->rx)
		munmap((void *)p->rx, ring_region_len(p->rx_size));
	if (p->sh)
		munmap(p->sh, sizeof(*p->sh));
	if (p->tx_memfd >= 0)
		sys_close(p->tx_memfd);
	memset(p, 0, sizeof(*p));
	p->tx_memfd = -1;
}

/*
 * Bind the shared memory to @app_fd (the side connection's number from now
 * on) with @tcp_fd hidden beside it.
 */
static void conn_shm(int app_fd, int tcp_fd, int role, struct shm_parts *p,
                     const struct ep *l, const struct ep *r, int domain, int nonblock)
{
	struct conn *c = conn_alloc(MODE_SHM);
	int sndbuf = SIDE_SNDBUF;

	sys_setsockopt(app_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	if (!c) {       /* cannot happen in practice; keep the descriptor sane */
		parts_free(p);
		return;
	}
	c->tcp_fd = tcp_fd;
	c->domain = domain;
	c->tx = p->tx;
	c->rx = p->rx;
	c->tx_size = p->tx_size;
	c->rx_size = p->rx_size;
	c->sh = p->sh;
	c->sh->nonblock = nonblock;
	c->local = *l;
	c->peer = *r;
	c->slot = stats_slot_alloc(stats_table(registry_fd, NULL, 0), app_fd, role);
	if (c->slot) {
		c->slot->local = *l;
		c->slot->peer = *r;
		c->slot->tx_ring = p->tx_size;
		c->slot->rx_ring = p->rx_size;
	}
	stats_slot_decide(totals, c->slot, MODE_SHM, R_NONE);
	if (p->tx_memfd >= 0)
		sys_close(p->tx_memfd);
	memset(p, 0, sizeof(*p));
	conn_bind_fd(c, app_fd);
	conn_put(c);
}

static int domain_of(int fd)
{
	int v = AF_INET;
	socklen_t l = sizeof(v);

	sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l);
	return (fd_flags(fd) & FDF_SMC) ? 43 /* AF_SMC */ : v;
}

/* ---- client side -------------------------------------------------------- */

struct client {
	int fd;                 /* the application's TCP socket */
	struct ep dst, src;
	uint64_t nonce, netns;
	char key[96];
	int reuse_was_set;
	int bound_by_us;
};

/* Reasons not to propose at all; R_NONE means go ahead. */
static int client_precheck(struct client *cl)
{
	enum listener_match m;

	if (registry_fd < 0)
		return R_NO_REGISTRY;
	cl->netns = netns_cookie(cl->fd);
	m = registry_listener_find(registry_fd, &cl->dst, cl->netns);
	switch (m) {
	case LM_NONE:      return R_PEER_NO_SMCLO;
	case LM_ELSEWHERE: return R_NOT_THIS_HOST;
	case LM_DEFER:     return R_DEFER_ACCEPT;
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
	if (conn_count() >= cfg.max_conns)
		return R_MAX_BUFFERS;
	return R_NONE;
}

/*
 * The proposal key needs our source port before the SYN leaves, so bind to
 * an ephemeral port.  SO_REUSEADDR lets the kernel hand out ports whose old
 * connections linger (as connect() itself would); accelerated connections
 * close their TCP socket with a reset, so they leave no TIME_WAIT behind.
 */
static int client_bind(struct client *cl)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	int one = 1, family = AF_INET;

	if (sock_ep(cl->fd, 0, &cl->src) < 0)
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
	if (sys_bind(cl->fd, &ss, l) < 0 || sock_ep(cl->fd, 0, &cl->src) < 0)
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

static int client_propose(struct client *cl)
{
	union clc_msg m;
	int side = side_get();

	if (side < 0)
		return R_NO_REGISTRY;
	cl->nonce = random_nonce();
	clc_init(&m, CLC_PROPOSAL, cl->nonce);
	m.proposal.pid = (uint32_t)getpid();
	m.proposal.uid = (uint32_t)getuid();
	m.proposal.rx_max = cfg.rx_max;
	m.proposal.tx_size = cfg.tx_size;
	m.proposal.netns = cl->netns;
	snprintf(m.proposal.side, sizeof(m.proposal.side), "%s", side_name);
	registry_proposal_key(cl->key, sizeof(cl->key), &cl->dst, cl->src.port);
	if (registry_proposal_put(registry_fd, cl->key, &m.proposal) < 0)
		return errno == EEXIST ? R_TUPLE_BUSY : R_NO_REGISTRY;
	return R_NONE;
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
	if (wait_fd(cl->fd, POLLOUT, now_ms() + cfg.handshake_ms) < 0) {
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

/* Wait for the server's side connection carrying ACCEPT or DECLINE. */
static int client_wait_answer(struct client *cl, union clc_msg *m, int fds[2], int *s_out)
{
	long deadline = now_ms() + cfg.handshake_ms;
	int claimed = 0;

	for (;;) {
		int s;

		if (wait_fd(side_fd, POLLIN, deadline) < 0) {
			if (claimed)
				return R_TIMEOUT;
			if (registry_proposal_withdraw(registry_fd, cl->key) == 0)
				return R_TIMEOUT;
			/* the server claimed it just now: its answer is on the way */
			claimed = 1;
			deadline = now_ms() + cfg.handshake_ms;
			continue;
		}
		s = sys_accept4(side_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (s < 0)
			continue;
		if (msg_recv(s, CLC_ACCEPT, cl->nonce, m, fds, 2, deadline) == 0) {
			*s_out = s;
			return R_NONE;
		}
		sys_close(s);   /* a stale or malformed answer: not ours */
	}
}

/* After ACCEPT: check, build our half, CONFIRM, wait for the decision. */
static int client_complete(struct client *cl, int s, union clc_msg *acc, int fds[2],
                           struct shm_parts *p)
{
	union clc_msg m;
	int reason = R_NONE, out[2];

	p->tx_memfd = -1;
	if (!peer_uid_ok(s))
		reason = R_DIFF_USER;
	else if (!proof_ok(cl->fd, fds[1]))
		reason = R_PROOF_FAILED;
	else if (acc->accept.ring_size > cfg.rx_max ||
	         !(p->rx = ring_map_peer(fds[0], acc->accept.ring_size)))
		reason = R_HANDSHAKE_ERROR;
	close_fds(fds, 2);
	if (reason == R_NONE) {
		p->rx_size = acc->accept.ring_size;
		p->tx_size = cfg.tx_size < acc->accept.rx_max ? cfg.tx_size : acc->accept.rx_max;
		p->tx = ring_create(p->tx_size, &p->tx_memfd);
		p->sh = conn_shared_new();
		if (!p->tx || !p->sh)
			reason = R_NO_MEMORY;
	}
	if (reason != R_NONE) {
		send_decline(s, cl->nonce, reason);
		return reason;
	}
	clc_init(&m, CLC_CONFIRM, cl->nonce);
	m.accept.pid = (uint32_t)getpid();
	m.accept.ring_size = p->tx_size;
	m.accept.rx_max = cfg.rx_max;
	m.accept.netns = cl->netns;
	out[0] = p->tx_memfd;
	out[1] = cl->fd;
	if (msg_send(s, &m, out, 2) < 0)
		return R_HANDSHAKE_ERROR;
	if (msg_recv(s, CLC_FINAL, cl->nonce, &m, out, 0, now_ms() + cfg.handshake_ms) == 0)
		return m.hdr.type == CLC_FINAL && m.final.ok ? R_NONE :
		       m.hdr.type == CLC_DECLINE ? (int)m.decline.reason : R_HANDSHAKE_ERROR;
	/* no word from the server: decide ourselves, unless it already did */
	if (registry_proposal_decide(registry_fd, cl->key, 0) == 0)
		return R_TIMEOUT;
	return registry_proposal_was_ok(registry_fd, cl->key) ? R_NONE : R_TIMEOUT;
}

/* Put the side connection where the TCP socket was, keeping the fd's flags. */
static void client_install(struct client *cl, int s, struct shm_parts *p)
{
	int fl = sys_fcntl(cl->fd, F_GETFL, 0);
	int fdfl = sys_fcntl(cl->fd, F_GETFD, 0);
	int domain = domain_of(cl->fd);
	int tcp;

	so_copy_timeouts(cl->fd, s);
	tcp = fd_dup_hidden(cl->fd);
	sys_dup3(s, cl->fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
	sys_close(s);
	sys_fcntl(cl->fd, F_SETFL, (fl & O_NONBLOCK) ? O_NONBLOCK : 0);
	conn_shm(cl->fd, tcp, ROLE_CLIENT, p, &cl->src, &cl->dst, domain, (fl & O_NONBLOCK) != 0);
}

static int client_fallback(struct client *cl, int reason)
{
	struct ep peer = cl->dst;

	if (cl->src.port == 0)
		sock_ep(cl->fd, 0, &cl->src);
	DBG("connect fd %d: tcp (%s)", cl->fd, reason_text(reason));
	conn_tcp(cl->fd, ROLE_CLIENT, reason, &cl->src, &peer, domain_of(cl->fd));
	return 0;
}

int hs_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct client cl = { .fd = fd };
	struct shm_parts parts = { .tx_memfd = -1 };
	union clc_msg acc;
	int reason, timed_out, fds[2], s = -1;

	if (ep_from_sockaddr(&cl.dst, sa, len) < 0)
		return sys_connect(fd, sa, len);
	reason = client_precheck(&cl);
	if (reason == R_NONE && client_bind(&cl) < 0)
		reason = R_NO_PORT;
	if (reason == R_NONE)
		reason = client_propose(&cl);
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
		registry_proposal_withdraw(registry_fd, cl.key);
		client_restore_reuse(&cl);
		if (timed_out)
			client_fallback(&cl, R_TIMEOUT);
		errno = e;
		return -1;
	}
	client_restore_reuse(&cl);
	sock_ep(fd, 0, &cl.src);        /* the address the route chose, now known */
	reason = client_wait_answer(&cl, &acc, fds, &s);
	if (reason == R_NONE)
		reason = acc.hdr.type == CLC_DECLINE ? (int)acc.decline.reason :
		         client_complete(&cl, s, &acc, fds, &parts);
	registry_proposal_cleanup(registry_fd, cl.key);
	if (reason != R_NONE) {
		if (s >= 0)
			sys_close(s);
		parts_free(&parts);
		return client_fallback(&cl, reason);
	}
	DBG("connect fd %d: shm (ring tx %u rx %u)", fd, parts.tx_size, parts.rx_size);
	client_install(&cl, s, &parts);
	return 0;
}

/* ---- server side -------------------------------------------------------- */

struct server {
	int fd;                 /* accepted TCP socket */
	struct ep local, peer;
	char key[96];
	union clc_msg prop;
	int s;                  /* side connection to the client */
};

static int server_connect_side(struct server *sv)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };

	if (registry_sun_path(registry_fd, "s", sv->prop.proposal.side, sun.sun_path,
	                      sizeof(sun.sun_path)) < 0)
		return -1;
	sv->s = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (sv->s < 0)
		return -1;
	if (sys_connect(sv->s, &sun, sizeof(sun)) < 0) {
		sys_close(sv->s);
		sv->s = -1;
		return -1;
	}
	return 0;
}

/* Everything after the claim; returns R_NONE with @p filled, or a reason. */
static int server_negotiate(struct server *sv, struct shm_parts *p)
{
	uint64_t nonce = sv->prop.hdr.nonce;
	union clc_msg m;
	int fds[2], reason = R_NONE;

	if (io_uring_in_use())
		reason = R_IO_URING;
	else if (conn_count() >= cfg.max_conns)
		reason = R_MAX_BUFFERS;
	else if (!peer_uid_ok(sv->s))
		reason = R_DIFF_USER;
	if (reason == R_NONE) {
		p->tx_size = cfg.tx_size < sv->prop.proposal.rx_max ? cfg.tx_size :
		             sv->prop.proposal.rx_max;
		p->tx = ring_create(p->tx_size, &p->tx_memfd);
		if (!p->tx)
			reason = R_NO_MEMORY;
	}
	if (reason != R_NONE) {
		send_decline(sv->s, nonce, reason);
		return reason;
	}
	clc_init(&m, CLC_ACCEPT, nonce);
	m.accept.pid = (uint32_t)getpid();
	m.accept.ring_size = p->tx_size;
	m.accept.rx_max = cfg.rx_max;
	m.accept.netns = netns_cookie(sv->fd);
	fds[0] = p->tx_memfd;
	fds[1] = sv->fd;
	if (msg_send(sv->s, &m, fds, 2) < 0)
		return R_HANDSHAKE_ERROR;
	if (msg_recv(sv->s, CLC_CONFIRM, nonce, &m, fds, 2, now_ms() + cfg.handshake_ms) < 0)
		return R_TIMEOUT;
	if (m.hdr.type == CLC_DECLINE)
		return (int)m.decline.reason;
	if (!proof_ok(sv->fd, fds[1]))
		reason = R_PROOF_FAILED;
	else if (m.accept.ring_size > cfg.rx_max ||
	         !(p->rx = ring_map_peer(fds[0], m.accept.ring_size)))
		reason = R_HANDSHAKE_ERROR;
	else if (!(p->sh = conn_shared_new()))
		reason = R_NO_MEMORY;
	close_fds(fds, 2);
	p->rx_size = m.accept.ring_size;
	if (reason != R_NONE)
		send_decline(sv->s, nonce, reason);
	return reason;
}

static int server_fallback(struct server *sv, int reason)
{
	DBG("accept fd %d: tcp (%s)", sv->fd, reason_text(reason));
	conn_tcp(sv->fd, ROLE_SERVER, reason, &sv->local, &sv->peer, domain_of(sv->fd));
	return sv->fd;
}

int hs_accept(int lfd, int fd, int flags)
{
	struct server sv = { .fd = fd, .s = -1 };
	struct shm_parts parts = { .tx_memfd = -1 };
	union clc_msg fin;
	int reason, domain;

	if (sock_ep(fd, 0, &sv.local) < 0 || sock_ep(fd, 1, &sv.peer) < 0)
		return fd;                      /* not an IP socket */
	if (!(fd_flags(lfd) & FDF_LISTENING))
		hs_listen(lfd);                 /* inherited listener: announce it now */
	fd_set_flags(fd, FDF_TCP | FDF_KNOWN);
	if (registry_fd < 0)
		return server_fallback(&sv, R_NO_REGISTRY);
	registry_proposal_key(sv.key, sizeof(sv.key), &sv.local, sv.peer.port);
	if (registry_proposal_get(registry_fd, sv.key, &sv.prop) < 0) {
		if (errno == ENOENT)
			return server_fallback(&sv, R_PEER_NO_SMCLO);
		registry_proposal_withdraw(registry_fd, sv.key);
		return server_fallback(&sv, R_HANDSHAKE_ERROR);
	}
	if (registry_proposal_claim(registry_fd, sv.key) < 0)
		return server_fallback(&sv, R_PEER_WITHDREW);
	if (server_connect_side(&sv) < 0) {
		registry_proposal_drop_claim(registry_fd, sv.key);
		return server_fallback(&sv, R_HANDSHAKE_ERROR);
	}
	reason = server_negotiate(&sv, &parts);
	if (reason == R_NONE && registry_proposal_decide(registry_fd, sv.key, 1) < 0)
		reason = R_TIMEOUT;             /* the client decided tcp first */
	if (reason != R_NONE) {
		registry_proposal_drop_claim(registry_fd, sv.key);
		sys_close(sv.s);
		parts_free(&parts);
		return server_fallback(&sv, reason);
	}
	clc_init(&fin, CLC_FINAL, sv.prop.hdr.nonce);
	fin.final.ok = 1;
	msg_send(sv.s, &fin, NULL, 0);
	DBG("accept fd %d: shm (ring tx %u rx %u)", sv.s, parts.tx_size, parts.rx_size);
	domain = domain_of(fd);
	so_copy_timeouts(fd, sv.s);
	if (!(flags & SOCK_NONBLOCK))
		sys_fcntl(sv.s, F_SETFL, 0);
	if (!(flags & SOCK_CLOEXEC))
		sys_fcntl(sv.s, F_SETFD, 0);
	fd_set_flags(fd, 0);
	conn_shm(sv.s, fd_hide(fd), ROLE_SERVER, &parts, &sv.local, &sv.peer, domain,
	         (flags & SOCK_NONBLOCK) != 0);
	return sv.s;
}

/* ---- listeners ---------------------------------------------------------- */

int hs_listen_bound(int fd)
{
	struct ep e;

	if (sock_ep(fd, 0, &e) < 0 || e.port == 0)
		return -1;
	hs_listen(fd);
	return (fd_flags(fd) & FDF_LISTENING) ? 0 : -1;
}

void hs_listen(int fd)
{
	struct ep e;
	unsigned flags = 0;
	int v = 0, lock;
	socklen_t l = sizeof(v);

	if (registry_fd < 0 || sock_ep(fd, 0, &e) < 0)
		return;
	if (sys_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, &l) == 0 && v)
		flags |= LISTEN_F_V6ONLY;
	v = 0;
	l = sizeof(v);
	if (sys_getsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, &l) == 0 && v)
		flags |= LISTEN_F_DEFER;
	lock = registry_listener_add(registry_fd, &e, netns_cookie(fd), flags);
	if (lock < 0)
		return;
	fd_set_listen_lock(fd, fd_hide(lock));
	fd_set_flags(fd, FDF_TCP | FDF_KNOWN | FDF_LISTENING | (fd_flags(fd) & FDF_SMC));
	DBG("listen fd %d: registered port %u", fd, e.port);
}

void hs_listener_closed(int fd)
{
	int lock = fd_take_listen_lock(fd);

	/* the entry stays alive while a forked process still holds the lock */
	if (lock >= 0)
		sys_close(lock);
	fd_set_flags(fd, fd_flags(fd) & ~FDF_LISTENING);
}
