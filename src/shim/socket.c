/*
 * socket.c - the socket calls: creating, connecting, accepting, listening,
 * shutting down, and a socket's identity (options, names, ioctl).  The
 * decisions are the handshake's (src/handshake/); an accelerated
 * descriptor answers like a TCP socket through fd/sockopt.c.
 */
#include "shim.h"
#include "epoll_early.h"

#include "addr.h"
#include "sockopt.h"

#include <netinet/tcp.h>
#include <stdarg.h>
#include <sys/ioctl.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif

/* ---- creating, connecting, accepting ------------------------------------ */

EXPORT int socket(int domain, int type, int protocol)
{
	REAL(socket);
	int smc = 0, fd;

	if (smclo_active && domain == AF_SMC && (type & 0xf) == SOCK_STREAM) {
		/* smc_run-style programs: SMCPROTO_SMC6 (1) means IPv6 */
		domain = protocol == 1 ? AF_INET6 : AF_INET;
		protocol = 0;
		smc = 1;
	}
	fd = real_socket(domain, type, protocol);
	if (fd < 0 || !smclo_active)
		return fd;
	if (fd_has_conn(fd))
		hs_release_fd(fd);      /* closed behind our back (close_range, exec) */
	if ((domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
	    (protocol == 0 || protocol == IPPROTO_TCP))
		fd_set_flags(fd, FDF_TCP | FDF_KNOWN | (smc ? FDF_SMC : 0) |
		             (domain == AF_INET6 ? FDF_INET6 : 0));
	else
		fd_set_flags(fd, FDF_KNOWN);
	return fd;
}

static int is_tcp_socket(int fd)
{
	uint16_t f = fd_flags(fd);
	int type = 0, proto = 0;
	socklen_t l = sizeof(int);

	if (f & FDF_KNOWN)
		return (f & FDF_TCP) != 0;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0)
		return 0;
	l = sizeof(int);
	sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l);
	return type == SOCK_STREAM && proto == IPPROTO_TCP;
}

/* A non-blocking connect() of TCP never completes within the call, even on
 * loopback: an accelerated one made at once says EINPROGRESS as well. */
static int connect_answer(int fd, int rc)
{
	if (rc == 0 && fd_has_conn(fd) && (sys_fcntl(fd, F_GETFL, 0) & O_NONBLOCK)) {
		fd_add_flags(fd, FDF_CONNECTING);
		errno = EINPROGRESS;
		return -1;
	}
	return rc;
}

/* Did connect() leave a connection up or on its way (not a failure the
 * program may retry on the same socket)?  errno as connect() left it. */
static int connect_under_way(int rc)
{
	return rc == 0 || errno == EINPROGRESS || errno == EALREADY || errno == EINTR ||
	       errno == EISCONN;
}

/*
 * Left on TCP (short-lived, no listener of ours, a fall-back) with its
 * connection up or on its way: the socket is the kernel's from now on.  A
 * later connect() - the one an event loop makes to learn that its
 * non-blocking connect completed, a retry after EINTR - must get the
 * kernel's answer, not start a handshake on a connection that is already
 * up: that one said EINPROGRESS again, and ab counted a failed connection.
 * Its epoll registrations made before need no records any more.
 */
static void connect_left_on_tcp(int fd)
{
	int e = errno;

	fd_clear_flags(fd, FDF_TCP);
	epoll_early_forget(fd);
	errno = e;
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	REAL(connect);
	int rc;

	if (!smclo_active || !sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
		return real_connect(fd, sa, len);
	if (hs_sandboxed()) {
		/* after a seccomp filter (seccomp.c) nothing new is accelerated */
		if (fd_flags(fd) & FDF_TCP)
			hs_sandboxed_tcp();
		return real_connect(fd, sa, len);
	}
	if (fd_has_conn(fd)) {
		if (fd_flags(fd) & FDF_CONNECTING) {
			fd_clear_flags(fd, FDF_CONNECTING);
			return 0;
		}
		errno = EISCONN;
		return -1;
	}
	if (!is_tcp_socket(fd))
		return real_connect(fd, sa, len);
	rc = connect_answer(fd, hs_connect(fd, sa, len));
	if (!fd_has_conn(fd) && connect_under_way(rc))
		connect_left_on_tcp(fd);
	return rc;
}

/* A listener taking connections without TCP (direct.c): one of those, or
 * HS_ACCEPT_KERNEL when the kernel has one (or the listener does not). */
static int accept_direct(int lfd, struct sockaddr *sa, socklen_t *len, int flags)
{
	struct ep from;
	int fd;

	if (sa && (int)*len < 0) {
		errno = EINVAL;
		return -1;
	}
	fd = hs_accept_direct(lfd, flags, &from);
	if (fd >= 0 && sa)
		ep_copy_out(&from, (fd_flags(lfd) & FDF_INET6) ? AF_INET6 : AF_INET, sa, len);
	return fd;
}

/*
 * The peer's address is asked of the kernel with the accept itself (no
 * getpeername() later) and copied out as accept() would: truncated to the
 * caller's room, the full length reported.
 */
EXPORT int accept4(int lfd, struct sockaddr *sa, socklen_t *len, int flags)
{
	REAL(accept4);
	struct sockaddr_storage peer;
	socklen_t peer_len = sizeof(peer);
	int fd;

	if (smclo_active && hs_sandboxed()) {
		fd = real_accept4(lfd, sa, len, flags);
		if (fd >= 0 && (fd_flags(lfd) & FDF_LISTENING))
			hs_sandboxed_tcp();
		return fd;
	}
	if (!smclo_active || (sa && !len) || !is_tcp_socket(lfd))
		return real_accept4(lfd, sa, len, flags);
	hs_kernel_accept(lfd, 1);    /* before looking at FDF_DIRECT (direct.c) */
	if (fd_flags(lfd) & FDF_DIRECT) {
		hs_kernel_accept(lfd, -1);
		if ((fd = accept_direct(lfd, sa, len, flags)) != HS_ACCEPT_KERNEL)
			return fd;
		hs_kernel_accept(lfd, 1);
	}
	fd = real_accept4(lfd, (struct sockaddr *)&peer, &peer_len, flags);
	hs_kernel_accept(lfd, -1);
	if (fd < 0)
		return fd;
	if (sa) {
		if ((int)*len < 0) {    /* the kernel drops the connection too */
			sys_close(fd);
			errno = EINVAL;
			return -1;
		}
		memcpy(sa, &peer, *len < peer_len ? *len : peer_len);
		*len = peer_len;
	}
	return hs_accept(lfd, fd, flags, (struct sockaddr *)&peer, peer_len);
}

EXPORT int accept(int lfd, struct sockaddr *sa, socklen_t *len)
{
	return accept4(lfd, sa, len, 0);
}

EXPORT int listen(int fd, int backlog)
{
	REAL(listen);
	int announce = smclo_active && !hs_sandboxed() && !(fd_flags(fd) & FDF_LISTENING) &&
	               is_tcp_socket(fd);
	int rc;

	if (fd_has_conn(fd)) {
		errno = EINVAL;         /* a connected TCP socket cannot listen */
		return -1;
	}
	/* announce a bound listener before it can accept, so an early client finds it */
	if (announce && hs_listen_bound(fd) == 0)
		announce = 0;
	rc = real_listen(fd, backlog);
	if (rc < 0 && (fd_flags(fd) & FDF_LISTENING))
		hs_listener_closed(fd);         /* the entry dies with its lock */
	else if (rc == 0 && announce)
		hs_listen(fd);                  /* the kernel picked the port just now */
	return rc;
}


EXPORT int shutdown(int fd, int how)
{
	REAL(shutdown);
	struct conn *c = shim_conn(fd);
	int rc;

	if (!c)
		return real_shutdown(fd, how);
	rc = close_shutdown(c, fd, how);
	if (rc == SHIM_MOVED) {
		hs_moved_follow(c);
		conn_put(c);
		return real_shutdown(fd, how);
	}
	conn_put(c);
	return (int)shim_ret(rc);
}

/* ---- identity ----------------------------------------------------------- */

EXPORT int getsockopt(int fd, int level, int opt, void *val, socklen_t *len)
{
	REAL(getsockopt);
	struct conn *c = shim_conn(fd);
	int rc;

	if (!c) {
		rc = real_getsockopt(fd, level, opt, val, len);
		/* a fallback AF_SMC socket still says what it was created as */
		if (rc == 0 && level == SOL_SOCKET && opt == SO_DOMAIN && (fd_flags(fd) & FDF_SMC))
			*(int *)val = AF_SMC;
		return rc;
	}
	rc = sockopt_get(c, fd, level, opt, val, len);
	conn_put(c);
	return (int)shim_ret(rc);
}

/*
 * Kernel TLS where the kernel offers it (sockopt_ulp_probe): the connection
 * goes on over its TCP socket first (core/move.c), which then takes the
 * option as it would on TCP, and its keys after it.  Where it cannot move
 * (no TCP beneath, or a process under a seccomp filter) the option is
 * refused as a kernel without it refuses it (fd/sockopt.c).  1 if this
 * answered (*@rc), 0 for sockopt_set.
 */
static int setsockopt_ulp(struct conn *c, int fd, const void *val, socklen_t len, int *rc)
{
	REAL(setsockopt);
	int probe;

	/* a process that confines itself gets no system call of ours (the
	 * probe's socket), and every connection it has that could move did */
	if (hs_sandboxed())
		return 0;
	probe = sockopt_ulp_probe(val, len);
	if (probe < 0) {
		*rc = probe;
		return 1;
	}
	if (hs_move_now(c, R_KERNEL_TLS) < 0)
		return 0;
	*rc = real_setsockopt(fd, IPPROTO_TCP, TCP_ULP, val, len) < 0 ? -errno : 0;
	return 1;
}

/*
 * TLS_RX on a connection moved for kernel TLS while bytes the peer sent
 * before the move still wait in the ring: the kernel would decrypt what
 * reaches the TCP socket, and these never do.  Refused (EBUSY), so the
 * program decrypts in user space what it reads (OpenSSL keeps that
 * direction itself when the kernel's fails); with the ring empty the
 * kernel takes it, and everything after the move comes through it.
 */
static int tls_rx_before_ring_drained(int fd, int level, int opt)
{
	struct conn *c;
	int holds;

	if (level != SOL_TLS || opt != TLS_RX || !(c = fd_get_conn(fd)))
		return 0;
	holds = c->mode == MODE_SHM && atomic_load(&c->moved_here) && rx_ring_holds(c);
	conn_put(c);
	return holds;
}

EXPORT int setsockopt(int fd, int level, int opt, const void *val, socklen_t len)
{
	REAL(setsockopt);
	struct conn *c = shim_conn(fd);
	int rc;

	if (!c && tls_rx_before_ring_drained(fd, level, opt))
		return (int)shim_ret(-EBUSY);
	if (!c) {
		if (level == SOL_SOCKET && (opt == SO_RCVTIMEO_OLD || opt == SO_SNDTIMEO_OLD ||
		                            opt == SO_RCVTIMEO_NEW || opt == SO_SNDTIMEO_NEW)) {
			fd_add_flags(fd, FDF_TIMEOUTS);
			if (opt == SO_RCVTIMEO_OLD || opt == SO_RCVTIMEO_NEW)
				hs_listener_no_direct(fd);      /* accept() would time out */
		}
		rc = real_setsockopt(fd, level, opt, val, len);
		if (rc == 0 && smclo_active && level == IPPROTO_TCP && opt == TCP_DEFER_ACCEPT &&
		    val && len >= sizeof(int) && *(const int *)val > 0)
			hs_listener_defers(fd);
		return rc;
	}
	if (!(level == IPPROTO_TCP && opt == TCP_ULP && setsockopt_ulp(c, fd, val, len, &rc)))
		rc = sockopt_set(c, fd, level, opt, val, len);
	conn_put(c);
	return (int)shim_ret(rc);
}

EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	REAL(getsockname);
	struct conn *c = shim_conn(fd);
	int rc;

	if (!c)
		return real_getsockname(fd, sa, len);
	rc = sockopt_name(c, 0, sa, len);
	conn_put(c);
	return (int)shim_ret(rc);
}

EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *len)
{
	REAL(getpeername);
	struct conn *c = shim_conn(fd);
	int rc;

	if (!c)
		return real_getpeername(fd, sa, len);
	rc = sockopt_name(c, 1, sa, len);
	conn_put(c);
	return (int)shim_ret(rc);
}

/* FIONREAD and SIOCATMARK of a connection moved to TCP (core/move.c): what
 * its ring still holds comes before what the kernel counted, and before
 * any urgent mark. */
static void moved_ioctl(int fd, unsigned long req, void *arg)
{
	struct conn *c = fd_get_conn(fd);
	uint32_t n;

	if (!c)
		return;
	if (c->mode == MODE_SHM && atomic_load(&c->moved_here) && (n = rx_available(c))) {
		if (req == FIONREAD)
			*(int *)arg += (int)n;
		else
			*(int *)arg = 0;
	}
	conn_put(c);
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	REAL(ioctl);
	va_list ap;
	void *arg;
	struct conn *c;
	int handled = 0, rc = 0;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	c = shim_conn(fd);
	if (c)
		rc = sockopt_ioctl(c, req, arg, &handled);
	if (!handled)
		rc = real_ioctl(fd, req, arg);
	if (!c && (req == FIONREAD || req == SIOCATMARK) && rc == 0 && fd_has_conn(fd))
		moved_ioctl(fd, req, arg);
	if (c && req == FIONBIO && rc == 0)
		atomic_store(&c->sh->nonblock, *(int *)arg != 0);
	if (!c && req == FIONBIO && rc == 0 && *(int *)arg)
		hs_listener_no_direct(fd);
	if (c)
		conn_put(c);
	return rc;
}
