/*
 * server.c - the server's handshake, inside accept(): the ACCEPT sent to the
 * client's rendezvous, CONFIRM awaited, and an offer taken from this
 * process's inbox (inbox.h) instead; both end in install.c.
 */
#include "hs_internal.h"

#include "io.h"
#include "peerinfo.h"
#include "region.h"
#include "registry.h"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

/* One unbound datagram socket per process sends every ACCEPT and DECLINE. */
static _Atomic int answer_sock = -1;

int server_answer_sock(void)
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
	int s = server_answer_sock();

	if (s < 0)
		return -1;
	return registry_rendezvous_send(sv->rendezvous, s, clc_prepare(&o, m, fds, nfds)) ==
	       (ssize_t)m->hdr.length ? 0 : -1;
}

int server_precheck(void)
{
	if (proof_io_uring_unseen())
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

	if (!(p->sh = shared_new()))
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

	p->up = m->accept.ring_size;
	p->down = m->accept.rx_max;
	/* sizes the client chose within what we offered */
	if (p->up > cfg.rx_max || p->down > cfg.tx_size ||
	    !(p->region = region_map(region_fd, p->up, p->down, &owner)))
		return R_HANDSHAKE_ERROR;
	/* the pid in CONFIRM is the client's word, in its own PID namespace */
	region_note_maker(p->region, 0);
	if (!config_uid_allowed(&cfg, owner))
		return R_DIFF_USER;
	return proof_ok(&sv->local, &sv->peer, sv->netns, tcp_fd, owner) ? R_NONE : R_PROOF_FAILED;
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

	long deadline = mono_now_ms() + (sv->confirm_ms ? sv->confirm_ms : cfg.handshake_ms);

	if (hs_msg_recv(sv->s, CLC_CONFIRM, sv->nonce, &m, fds, 2, deadline) < 0) {
		/* before the deadline: the client hung up its end, it gave up */
		int gave_up = mono_now_ms() < deadline ? R_PEER_WITHDREW : R_TIMEOUT;
		/* close the door, then a last look (see top of file) */
		sys_shutdown(sv->s, SHUT_RD);
		if (hs_msg_recv(sv->s, CLC_CONFIRM, sv->nonce, &m, fds, 2, 0) < 0)
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
	install_tcp(sv->fd, ROLE_SERVER, reason, &sv->local, &sv->peer);
	return sv->fd;
}

/* Tell a waiting client no, so it need not wait out its timeout. */
static int server_decline(struct server *sv, int reason)
{
	union clc_msg m;

	hs_msg_decline_init(&m, 0, reason);
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
	int domain = proof_domain_of(model);

	DBG("accept fd %d: shm (ring tx %u rx %u)%s", sv->s, p->down, p->up,
	    sv->direct ? " without TCP" : "");
	p->rcvtimeo_ms = sockopt_copy_timeouts(model, sv->s);
	p->direct = sv->direct;
	if (sv->flags & SOCK_NONBLOCK)  /* every pair end comes blocking, as its maker made it */
		sys_fcntl(sv->s, F_SETFL, O_NONBLOCK);
	if (!sv->direct) {
		fd_set_flags(sv->fd, 0);
		tcp = io_keep_fd(sv->fd);
	}
	install_shm(sv->s, tcp, ROLE_SERVER, p, &sv->local, &sv->peer, domain,
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
		install_parts_free(&parts);
		return server_fallback(sv, reason);
	}
	return server_install(sv, &parts);
}

/* ---- server side: an offer from our inbox (inbox.h) --------------------- */

/* A direct offer's proof: the client's own TCP socket, bound (its address
 * is the peer's) in our namespace, and a destination our listener covers. */
static int proof_direct(struct server *sv, int theirs)
{
	return proof_sock_is_tcp(theirs) && proof_netns_cookie(theirs) == sv->netns &&
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
	if ((maker = proof_peer_pid_allowed(s, NULL)) < 0)
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
	      proof_same_host(&sv->local, sv->netns, fds[OFFER_FD_TCP], owner)))
		return R_PROOF_FAILED;
	if (!(p->sh = shared_new()))
		return R_NO_MEMORY;
	return R_NONE;
}

/*
 * An offer to a listener that defers accept: the client's first bytes came
 * over TCP (they woke us), and their count comes in the ring header as soon
 * as its send returned.  Copied (peeked: still in the socket if we do not
 * take the offer) to the head of its ring, where the client's stream goes
 * on.  R_NONE when they are there, else the reason to decline.
 */
/* How long a server in accept() waits for a woken client's count and bytes:
 * an honest one's come microseconds after they woke it; a client that lies
 * costs the server no more than this, and goes to TCP. */
#define PREFIX_WAIT_MS 50

static int server_tcp_prefix(struct server *sv, struct shm_parts *p)
{
	struct ring_hdr *up = region_up(p->region);
	long until = mono_now_ms() + PREFIX_WAIT_MS;
	uint64_t pre;
	int avail = 0;

	/* woken without bytes (a FIN, the kernel's deferral ran out): none coming */
	if (sys_ioctl_int(sv->fd, FIONREAD, &avail) < 0 || avail <= 0)
		return R_DEFER_ACCEPT;
	/* the client says how many right after its send returned: microseconds */
	while (!((pre = atomic_load_explicit(&up->tcp_prefix, memory_order_acquire)) &
	         RING_PREFIX_SET) && mono_now_ms() < until)
		nanosleep(&(struct timespec){ .tv_nsec = 10000 }, NULL);
	pre &= ~RING_PREFIX_SET;
	if (!(atomic_load(&up->tcp_prefix) & RING_PREFIX_SET) || pre == 0 || pre > p->up)
		return R_HANDSHAKE_ERROR;
	while (sys_ioctl_int(sv->fd, FIONREAD, &avail) == 0 && (uint64_t)avail < pre &&
	       mono_now_ms() < until)
		nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);  /* on loopback: there */
	/* exactly those: a byte more came over TCP where smclo did not see it
	 * sent (a raw system call) and would be left behind the ring's */
	if ((uint64_t)avail != pre ||
	    sys_recv(sv->fd, ring_data(up), (size_t)pre, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)pre)
		return R_HANDSHAKE_ERROR;
	sv->tcp_prefix = pre;
	return R_NONE;
}

int server_take_offer(struct server *sv, const union clc_msg *m, int fds[OFFER_FDS])
{
	struct shm_parts p = { 0 };
	int reason;

	if (!sv->direct)
		sv->netns = proof_netns_cookie(sv->fd);
	reason = offer_check(sv, m, fds, &p);
	if (reason == R_NONE && (m->accept.flags & CLC_OFFER_F_TCP_PREFIX) && !sv->direct)
		reason = server_tcp_prefix(sv, &p);
	if (p.region && inbox_offer_decide(region_up(p.region), reason == R_NONE ? OFFER_TAKEN :
	                             OFFER_DECLINED | (uint32_t)reason << 8) < 0)
		reason = R_PEER_WITHDREW;       /* the client gave up first */
	/* taken: the first bytes are the ring's now, and TCP's no more */
	if (reason == R_NONE && sv->tcp_prefix)
		sys_recv(sv->fd, NULL, (size_t)sv->tcp_prefix, MSG_TRUNC | MSG_DONTWAIT);
	sys_close(fds[OFFER_FD_TCP]);
	sys_close(fds[OFFER_FD_REGION]);
	if (reason != R_NONE) {
		sys_close(fds[OFFER_FD_PAIR]);
		install_parts_free(&p);
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

/*
 * May our TCP socket go to the rendezvous that user @owner bound?  Anyone
 * may bind one under any tuple's name: another user's only when the
 * kernel says that user owns the client's end of this connection.
 */
static int server_rendezvous_owner(const struct server *sv, uid_t owner)
{
	uid_t uid;

	if (!config_uid_allowed(&cfg, owner))
		return R_DIFF_USER;
	if (owner == 0 || config_uid_trusted(&cfg, owner))
		return R_NONE;
	return peerinfo_tcp_uid(&sv->peer, &sv->local, &uid) == 0 && uid == owner ?
	       R_NONE : R_UNVERIFIED;
}

#define CONFIRM_OTHER_MS 30     /* server_wait_confirm, for another user's client */

/* ---- accept(): an offer in our inbox, a rendezvous, or plain TCP -------- */

int hs_accept(int lfd, int fd, int flags, const struct sockaddr *peer, socklen_t peer_len)
{
	struct server sv = { .fd = fd, .flags = flags, .s = -1 };
	uid_t owner;
	int rc;

	if (ep_from_sockaddr(&sv.peer, peer, peer_len) < 0)
		return fd;                      /* not an IP socket */
	if (!(fd_flags(lfd) & FDF_LISTENING))
		hs_listen(lfd);                 /* inherited listener: announce it now */
	/* accept() gives addresses in the socket's own family */
	fd_set_flags(fd, FDF_TCP | FDF_KNOWN | (peer->sa_family == AF_INET6 ? FDF_INET6 : 0) |
	             ((fd_flags(lfd) & (FDF_KNOWN | FDF_TIMEOUTS)) != FDF_KNOWN ? FDF_TIMEOUTS : 0));
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
				direct_listener_go(lfd);
			return rc;
		}
	}
	if (!registry_rendezvous_any(registry_fd))
		return server_fallback(&sv, R_PEER_NO_SMCLO);   /* no client waits under p/ */
	registry_rendezvous_key(sv.key, sizeof(sv.key), &sv.local, sv.peer.port);
	sv.rendezvous = registry_rendezvous_open(registry_fd, sv.key, &owner);
	if (sv.rendezvous < 0)
		return server_fallback(&sv, R_PEER_NO_SMCLO);
	sv.netns = proof_netns_cookie(fd);
	rc = server_rendezvous_owner(&sv, owner);
	/* an honest client confirms at once (it waits for our ACCEPT); one of
	 * another user holding our accept() costs us no more than this */
	if (owner != 0 && !config_uid_trusted(&cfg, owner))
		sv.confirm_ms = CONFIRM_OTHER_MS;
	rc = rc == R_NONE ? server_handshake(&sv) : server_decline(&sv, rc);
	sys_close(sv.rendezvous);
	return rc;
}
