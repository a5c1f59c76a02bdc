/*
 * sockopt.c - an accelerated descriptor still answers like a TCP socket.
 *
 * Options are served by the hidden TCP socket, which is a real, connected
 * TCP socket: what the application set before the switch is still there, and
 * what it sets after lands there too.  A connection set up without TCP (the
 * direct handshake) has an unconnected one - the client's own socket, or on
 * the server's side one made when an option is first asked - and its
 * addresses are the recorded ones.  Only the options that change how the
 * descriptor *behaves* (timeouts) are also applied to the doorbell socket,
 * and the buffer sizes of the doorbell socket are never touched, because its
 * send buffer is the doorbell budget.
 */
#include "sockopt.h"
#include "fdtab.h"

#include "io.h"
#include "log.h"
#include "sys.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif

/* An int option's answer, as the kernel gives it: cut to a shorter buffer. */
static int put_int(void *val, socklen_t *len, int v)
{
	if (!len || (int)*len < 0)
		return -EINVAL;
	if (*len > sizeof(int))
		*len = sizeof(int);
	if (*len && !val)
		return -EFAULT;
	memcpy(val, &v, *len);
	return 0;
}

/* The hidden socket options go to; a server's direct connection makes one on first use. */
static int option_socket(struct conn *c)
{
	int fd = __atomic_load_n(&c->tcp_fd, __ATOMIC_ACQUIRE), none = -1;

	if (fd >= 0)
		return fd;
	fd = sys_socket(c->domain == AF_INET6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	fd = fd_hide(fd);
	if (!__atomic_compare_exchange_n(&c->tcp_fd, &none, fd, 0, __ATOMIC_ACQ_REL,
	                                 __ATOMIC_ACQUIRE)) {
		sys_close(fd);          /* another thread made it first */
		return none;
	}
	return fd;
}

/*
 * TCP_INFO comes from the hidden TCP socket, which carries none of the
 * connection's bytes and none of its ends: the state and the byte counters
 * are the rings' (struct tcp_info of linux/tcp.h: the state is its first
 * byte, bytes_acked and bytes_received the two u64 at 120 and 128).
 */
#define TCPI_BYTES_ACKED 120
#define TCPI_BYTES_RECEIVED 128

static uint8_t sockopt_tcp_state(struct conn *c)
{
	uint32_t f = atomic_load(&c->sh->flags);
	uint32_t pf = atomic_load_explicit(&c->rx->flags, memory_order_acquire);
	int fin_in = (pf & (RING_F_SHUTDOWN | RING_F_CLOSED)) || (f & SH_PEER_SHUT);

	if (tcpend_reset(c) || (fin_in && (f & SH_SHUT_WR)))
		return TCP_CLOSE;
	if (f & SH_SHUT_WR)
		return TCP_FIN_WAIT1;   /* as loopback TCP reads: its FIN's ACK is delayed */
	return fin_in ? TCP_CLOSE_WAIT : TCP_ESTABLISHED;
}

/* The hidden socket's struct tcp_info, the rings' state and counts in it. */
static int sockopt_tcp_info(struct conn *c, void *val, socklen_t *len)
{
	uint64_t at[(TCPI_BYTES_RECEIVED + 8 + 255) / 8] = { 0 };     /* room to spare */
	socklen_t l = *len < sizeof(at) ? *len : (socklen_t)sizeof(at);

	if (!val || (int)*len < 0)
		return -EINVAL;
	if (sys_getsockopt(option_socket(c), IPPROTO_TCP, TCP_INFO, at, &l) < 0)
		return -errno;
	*(uint8_t *)at = sockopt_tcp_state(c);
	if (l >= TCPI_BYTES_RECEIVED + 8) {
		at[TCPI_BYTES_ACKED / 8] += atomic_load(&c->rx->cons);        /* the peer took them */
		at[TCPI_BYTES_RECEIVED / 8] += atomic_load(&c->rx->prod) & ~RING_PROD_MOVED;
	}
	memcpy(val, at, l);
	*len = l;
	return 0;
}

int sockopt_get(struct conn *c, int fd, int level, int opt, void *val, socklen_t *len)
{
	if (level == SOL_SOCKET) {
		switch (opt) {
		case SO_ERROR: {
			/* the hidden socket's own errors (a reset when the peer
			 * closed its copy) say nothing about this connection:
			 * the error a reset of the rings left pending does */
			return put_int(val, len, tcpend_take_error(c));
		}
		case SO_DOMAIN:
			return put_int(val, len, c->domain);
		case SO_RCVTIMEO:
		case SO_SNDTIMEO:
			return (int)sys_result(sys_getsockopt(fd, level, opt, val, len));
		}
	}
	if (level == IPPROTO_TCP && opt == TCP_INFO && len)
		return sockopt_tcp_info(c, val, len);
	return (int)sys_result(sys_getsockopt(option_socket(c), level, opt, val, len));
}

/*
 * An upper layer protocol under the socket (TCP_ULP: kernel TLS, then its
 * keys at SOL_TLS) set on the hidden TCP socket, which carries none of this
 * connection's bytes, would have the program write plaintext for the
 * kernel to encrypt, and the ring would carry it as it is.  So the shim
 * moves a connection to its TCP socket first where the kernel would take
 * the protocol (sockopt_ulp_probe); what reaches here is a connection that
 * cannot move, and the option is refused as a kernel without the protocol
 * refuses it, so the program (OpenSSL) keeps encrypting in user space: 0,
 * or the -errno of that refusal.
 */
static int sockopt_refused(int level, int opt)
{
	if (level == IPPROTO_TCP && opt == TCP_ULP)
		return -ENOENT;         /* no such upper layer protocol */
	if (level == SOL_TLS)
		return -ENOPROTOOPT;    /* not a socket with TLS on it */
	return 0;
}

int sockopt_ulp_probe(const void *val, socklen_t len)
{
	int s = sys_socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int rc;

	if (s < 0)
		return -errno;
	/* the protocol exists and wants a connection (kernel TLS), or takes
	 * any socket; else what the connection itself would have been told */
	rc = sys_setsockopt(s, IPPROTO_TCP, TCP_ULP, val, len) == 0 || errno == ENOTCONN ? 0 : -errno;
	sys_close(s);
	return rc;
}

/* SO_LINGER {1, 0} makes the last close an abort, which the peer hears as a
 * reset (core/close.c); the kernel took the option, so @val is a linger. */
static void sockopt_linger_set(struct conn *c, const void *val)
{
	struct linger l;

	memcpy(&l, val, sizeof(l));
	if (l.l_onoff && l.l_linger == 0)
		atomic_fetch_or(&c->sh->flags, SH_LINGER_ABORT);
	else
		atomic_fetch_and(&c->sh->flags, ~SH_LINGER_ABORT);
}

/* SO_RCVLOWAT, as the kernel took it (a negative mark is INT_MAX, 0 is 1):
 * the rings' readers honour it, and the peer rings when it is reached. */
static void sockopt_rcvlowat_set(struct conn *c, const void *val)
{
	int v;

	memcpy(&v, val, sizeof(v));
	v = v < 0 ? INT_MAX : v ? v : 1;
	atomic_store(&c->sh->rcvlowat, (uint32_t)v);
	atomic_store(&c->tx->lowat, (uint32_t)v);
}

int sockopt_set(struct conn *c, int fd, int level, int opt, const void *val, socklen_t len)
{
	int rc = sockopt_refused(level, opt);

	if (rc < 0) {
		DBG("setsockopt fd %d: level %d option %d refused: nothing under the ring "
		    "carries its bytes", fd, level, opt);
		return rc;
	}
	rc = (int)sys_result(sys_setsockopt(option_socket(c), level, opt, val, len));

	if (rc == 0 && level == SOL_SOCKET && (opt == SO_RCVTIMEO || opt == SO_SNDTIMEO))
		rc = (int)sys_result(sys_setsockopt(fd, level, opt, val, len));
	if (rc == 0 && level == SOL_SOCKET && opt == SO_RCVTIMEO)
		atomic_store(&c->sh->rcvtimeo_ms, 0);
	if (rc == 0 && level == SOL_SOCKET && opt == SO_LINGER)
		sockopt_linger_set(c, val);
	if (rc == 0 && level == SOL_SOCKET && opt == SO_RCVLOWAT)
		sockopt_rcvlowat_set(c, val);
	return rc;
}

int sockopt_rcvtimeo_ms(struct conn *c, int fd)
{
	int ms = atomic_load_explicit(&c->sh->rcvtimeo_ms, memory_order_relaxed) - 1;
	struct timeval tv = { 0 };
	socklen_t l = sizeof(tv);

	if (ms >= 0)
		return ms;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) < 0)
		return 0;
	ms = (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
	atomic_store_explicit(&c->sh->rcvtimeo_ms, ms + 1, memory_order_relaxed);
	return ms;
}

int sockopt_name(struct conn *c, int peer, struct sockaddr *sa, socklen_t *len)
{
	int rc;

	if (c->direct) {
		ep_copy_out(peer ? &c->peer : &c->local, c->domain, sa, len);
		return 0;
	}
	/* from the hidden socket while it is connected, so the family and
	 * scope are exactly what the application had */
	rc = peer ? sys_getpeername(c->tcp_fd, sa, len) : sys_getsockname(c->tcp_fd, sa, len);
	if (rc == 0 || !peer)
		return (int)sys_result(rc);
	/* the peer reset its hidden copy: answer from what we recorded */
	ep_copy_out(&c->peer, c->domain, sa, len);
	return 0;
}

int sockopt_ioctl(struct conn *c, unsigned long req, void *arg, int *handled)
{
	*handled = 1;
	switch (req) {
	case FIONREAD: {
		/* references to a hostile peer's pool may claim more than an int */
		uint32_t n = rx_available(c);

		*(int *)arg = n > INT_MAX ? INT_MAX : (int)n;
		return 0;
	}
	case SIOCATMARK:
		/* urgent data moves a connection to TCP (core/move.c): a ring
		 * holds none, and its bytes come before any mark */
		*(int *)arg = 0;
		return 0;
	}
	/*
	 * SIOCOUTQ counts bytes the peer has not acknowledged: a ring's bytes
	 * are all with the peer, as a loopback socket's are once queued at the
	 * receiver, so the TCP socket's 0 is the answer - as for SIOCOUTQNSD and
	 * the socket layer's requests after SIOCATMARK (0x89xx: SIOCGSTAMP...),
	 * which a doorbell socket would answer as AF_UNIX does.  The owner
	 * requests before it (FIOSETOWN...) are the descriptor's: its signals
	 * come from the doorbell socket.
	 */
	if (req == SIOCOUTQ || ((req & 0xff00) == 0x8900 && req > SIOCATMARK)) {
		int s = option_socket(c);

		return s < 0 ? -errno : (int)sys_result(sys_ioctl(s, req, arg));
	}
	*handled = 0;
	return 0;
}

int sockopt_may_have_timeouts(int fd)
{
	/* a socket made here whose timeouts nobody set has none */
	return (fd_flags(fd) & (FDF_KNOWN | FDF_TIMEOUTS)) != FDF_KNOWN || fd_options_shared;
}

int sockopt_copy_timeouts(int from_tcp, int to_unix)
{
	static const int opts[] = { SO_RCVTIMEO, SO_SNDTIMEO };
	int rcv_ms = 0;

	if (!sockopt_may_have_timeouts(from_tcp))
		return 0;       /* no system call */
	for (size_t i = 0; i < 2; i++) {
		struct timeval tv;
		socklen_t l = sizeof(tv);
		if (sys_getsockopt(from_tcp, SOL_SOCKET, opts[i], &tv, &l) == 0 &&
		    (tv.tv_sec || tv.tv_usec)) {
			sys_setsockopt(to_unix, SOL_SOCKET, opts[i], &tv, sizeof(tv));
			if (opts[i] == SO_RCVTIMEO)
				rcv_ms = (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
		}
	}
	return rcv_ms;
}
