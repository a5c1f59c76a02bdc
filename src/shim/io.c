/*
 * io.c - reading and writing: the read, recv and write families, sendfile
 * and splice.  An accelerated connection's bytes go through its rings
 * (core/rx.c, core/tx.c); a message that passes descriptors goes through the
 * hand-over (handover/passfd.c); everything else straight to libc.
 */
#include "shim.h"

#include "iov.h"
#include "passfd.h"

#include <sys/sendfile.h>

/* ---- receiving ---------------------------------------------------------- */

/*
 * More vectors than the kernel takes (IOV_MAX): the program's own call on
 * the descriptor fails as the kernel fails it (EINVAL for readv and writev,
 * EMSGSIZE for the message calls), and nothing moves.
 */
static int iov_count_refused(int n)
{
	return n < 0 || n > IOV_MAX;
}

/* MSG_TRUNC on TCP drops the bytes without copying them anywhere: taken
 * into scratch space, at most its size per call (a short read). */
static ssize_t recv_discard(struct conn *c, int fd, const struct iovec *iov, int n, int flags)
{
	char scratch[8192];
	size_t want = iov_total(iov, n);
	struct iovec s = { scratch, want < sizeof(scratch) ? want : sizeof(scratch) };

	return rx_recv(c, fd, &s, 1, flags & ~MSG_TRUNC);
}

/*
 * After a move, the ring's last bytes and TCP's first are one stream: a
 * read the ring answered short (its last bytes) goes on with what TCP has
 * (which stops at an urgent mark, as one TCP read would), and MSG_WAITALL
 * waits there for the rest.  Not in a sandboxed process: its filter allows
 * the program's own calls only, and this would be one more.
 */
static ssize_t recv_tcp_rest(struct conn *c, int fd, const struct iovec *iov, int n,
                             ssize_t got, int flags)
{
	struct iovec tail[64];
	struct msghdr m = { .msg_iov = tail };
	ssize_t k;

	int at_mark = 0;

	if ((size_t)got >= iov_total(iov, n) || hs_sandboxed() ||
	    hs_moved_follow(c))
		return got;     /* the whole read, or the ring has more */
	/* at an urgent mark TCP's read would have stopped too, where a read
	 * of our own would go on past it */
	if (sys_ioctl(fd, SIOCATMARK, &at_mark) == 0 && at_mark)
		return got;
	m.msg_iovlen = (size_t)iov_tail(iov, n, (size_t)got, tail, 64);
	k = sys_recvmsg(fd, &m, (flags & MSG_WAITALL) ? flags : flags | MSG_DONTWAIT);
	return k > 0 ? got + k : got;
}

/*
 * -errno, or SHIM_MOVED: the program's own call reads the TCP socket (or,
 * for a vector count the kernel refuses, fails there).
 */
static ssize_t recv_iov(struct conn *c, int fd, const struct iovec *iov, int n, int flags)
{
	ssize_t r;

	if (iov_count_refused(n)) {
		conn_put(c);
		return SHIM_MOVED;
	}
	if ((flags & (MSG_TRUNC | MSG_PEEK)) == MSG_TRUNC) {
		r = recv_discard(c, fd, iov, n, flags);
		if (r == SHIM_MOVED)
			hs_moved_follow(c);     /* the program's own call drops TCP's bytes */
		conn_put(c);
		return r;
	}

	/* urgent data is TCP's: a peer that sent some moved the connection */
	if ((flags & MSG_OOB) && move_seen(c)) {
		hs_moved_follow(c);
		conn_put(c);
		return SHIM_MOVED;
	}
	r = rx_recv(c, fd, iov, n, flags);
	/* moved while we waited: @fd becomes the TCP socket, and what the ring
	 * still answers (an end the peer published there first) comes first */
	if (r == SHIM_MOVED && hs_moved_follow(c))
		r = rx_recv(c, fd, iov, n, flags);
	if (r > 0 && move_seen(c))
		r = recv_tcp_rest(c, fd, iov, n, r, flags);
	conn_put(c);
	return r;
}

ssize_t shim_recv_conn(struct conn *c, int fd, const struct iovec *iov, int n, int flags)
{
	return recv_iov(c, fd, iov, n, flags);
}

/* A read through the rings, or the program's own call when that says so. */
#define RECV_OR(c, fd, iov, n, flags, real_call)                                  \
	do {                                                                      \
		ssize_t r_ = recv_iov(c, fd, iov, n, flags);                      \
		return r_ == SHIM_MOVED ? (real_call) : shim_ret(r_);             \
	} while (0)

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	REAL(read);
	struct conn *c = shim_conn_reading(fd, n, 0);
	struct iovec iov = { buf, n };

	if (c)
		RECV_OR(c, fd, &iov, 1, 0, real_read(fd, buf, n));
	return real_read(fd, buf, n);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	REAL(__read_chk);
	struct conn *c = shim_conn_reading(fd, n, 0);
	struct iovec iov = { buf, n };

	if (c && n <= buflen)
		RECV_OR(c, fd, &iov, 1, 0, real___read_chk(fd, buf, n, buflen));
	if (c)
		conn_put(c);
	return real___read_chk(fd, buf, n, buflen);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	REAL(readv);
	struct conn *c = shim_conn_reading(fd, n > 0 ? iov_total(iov, n) : 0, 0);

	if (c)
		RECV_OR(c, fd, iov, n, 0, real_readv(fd, iov, n));
	return real_readv(fd, iov, n);
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	REAL(recv);
	struct conn *c = shim_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (c)
		RECV_OR(c, fd, &iov, 1, flags, real_recv(fd, buf, n, flags));
	return real_recv(fd, buf, n, flags);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	REAL(__recv_chk);
	struct conn *c = shim_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (c && n <= buflen)
		RECV_OR(c, fd, &iov, 1, flags, real___recv_chk(fd, buf, n, buflen, flags));
	if (c)
		conn_put(c);
	return real___recv_chk(fd, buf, n, buflen, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa,
                        socklen_t *len)
{
	REAL(recvfrom);
	struct conn *c = shim_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (!c)
		return real_recvfrom(fd, buf, n, flags, sa, len);
	if (sa && len)
		*len = 0;       /* a connected TCP socket reports no source address */
	RECV_OR(c, fd, &iov, 1, flags, real_recvfrom(fd, buf, n, flags, sa, len));
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
                              struct sockaddr *sa, socklen_t *len)
{
	REAL(__recvfrom_chk);
	struct conn *c = shim_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (c && n <= buflen) {
		if (sa && len)
			*len = 0;
		RECV_OR(c, fd, &iov, 1, flags,
		        real___recvfrom_chk(fd, buf, n, buflen, flags, sa, len));
	}
	if (c)
		conn_put(c);
	return real___recvfrom_chk(fd, buf, n, buflen, flags, sa, len);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	REAL(recvmsg);
	struct conn *c = shim_conn_reading(fd, m->msg_iovlen > 0 && m->msg_iovlen < 1024 ?
	                                   iov_total(m->msg_iov, (int)m->msg_iovlen) : 0, flags);
	ssize_t r;

	if (!c)         /* descriptors passed to us may be connections */
		return smclo_active && m->msg_controllen && m->msg_control ?
		       passfd_recvmsg(fd, m, flags, real_recvmsg) : real_recvmsg(fd, m, flags);
	r = recv_iov(c, fd, m->msg_iov, (int)m->msg_iovlen, flags);
	if (r == SHIM_MOVED)
		return real_recvmsg(fd, m, flags);
	r = shim_ret(r);
	if (r >= 0) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

/* ---- sending ------------------------------------------------------------ */

/*
 * -errno, or SHIM_MOVED: the program's own call writes to the TCP socket.
 * Urgent data (MSG_OOB) is TCP's own: the connection moves there first
 * (core/move.c), after every byte the ring holds.
 */
static ssize_t send_iov(struct conn *c, int fd, const struct iovec *iov, int n, int flags)
{
	ssize_t r;

	if (iov_count_refused(n)) {
		conn_put(c);
		return SHIM_MOVED;      /* the kernel's own refusal (recv_iov) */
	}
	r = (flags & MSG_OOB) && hs_move_now(c, R_URGENT) == 0 ? SHIM_MOVED :
	    tx_send(c, fd, iov, n, flags);

	if (r == SHIM_MOVED)
		hs_moved_follow(c);
	conn_put(c);
	return r;
}

/* A write through the rings, or the program's own call when that says so. */
#define SEND_OR(c, fd, iov, n, flags, real_call)                                  \
	do {                                                                      \
		ssize_t r_ = send_iov(c, fd, iov, n, flags);                      \
		return r_ == SHIM_MOVED ? (real_call) : shim_ret(r_);             \
	} while (0)

/*
 * shim_conn() for the sending calls: while the handshake is undecided a
 * small write goes into the ring without waiting for the decision, or a
 * first one over TCP to a listener that defers accept (*sent says how much,
 * or -1 with errno; SEND_PASS when it did not).
 */
#define SEND_PASS (-2)
static struct conn *shm_conn_send(int fd, const struct iovec *iov, int n, int flags,
                                  ssize_t *sent)
{
	*sent = SEND_PASS;
	if (smclo_active && (fd_flags(fd) & FDF_PREFIX) && hs_send_prefix(fd, iov, n, flags, sent))
		return NULL;
	*sent = SEND_PASS;
	if (smclo_active && (fd_flags(fd) & FDF_PENDING) && !(flags & MSG_OOB)) {
		struct conn *c = fd_get_conn(fd);
		if (c) {
			*sent = tx_send_pending(c, iov, n);
			conn_put(c);
			if (*sent >= 0)
				return NULL;
			*sent = SEND_PASS;
		}
	}
	return shim_conn(fd);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	REAL(write);
	struct iovec iov = { (void *)buf, n };
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, &iov, 1, 0, &sent);

	if (sent != SEND_PASS)
		return sent;
	if (c)
		SEND_OR(c, fd, &iov, 1, 0, real_write(fd, buf, n));
	return real_write(fd, buf, n);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	REAL(writev);
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, iov, n, 0, &sent);

	if (sent != SEND_PASS)
		return sent;
	if (c)
		SEND_OR(c, fd, iov, n, 0, real_writev(fd, iov, n));
	return real_writev(fd, iov, n);
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	REAL(send);
	struct iovec iov = { (void *)buf, n };
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, &iov, 1, flags, &sent);

	if (sent != SEND_PASS)
		return sent;
	if (c)
		SEND_OR(c, fd, &iov, 1, flags, real_send(fd, buf, n, flags));
	return real_send(fd, buf, n, flags);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags,
                      const struct sockaddr *sa, socklen_t len)
{
	REAL(sendto);
	struct iovec iov = { (void *)buf, n };
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, &iov, 1, flags, &sent);

	if (sent != SEND_PASS)
		return sent;
	/* a connected TCP socket ignores a destination address */
	if (c)
		SEND_OR(c, fd, &iov, 1, flags, real_sendto(fd, buf, n, flags, sa, len));
	return real_sendto(fd, buf, n, flags, sa, len);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	REAL(sendmsg);
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, m->msg_iov, (int)m->msg_iovlen, flags, &sent);

	if (sent != SEND_PASS)
		return sent;
	if (c)
		SEND_OR(c, fd, m->msg_iov, (int)m->msg_iovlen, flags, real_sendmsg(fd, m, flags));
	if (smclo_active && m->msg_controllen && conn_count() > 0)
		return passfd_sendmsg(fd, m, flags, real_sendmsg);
	return real_sendmsg(fd, m, flags);
}

/* Bytes from a file or pipe are no first write that could go over TCP as one. */
static struct conn *shim_conn_filling(int out)
{
	if (smclo_active && (fd_flags(out) & FDF_PREFIX))
		hs_resolve_fd(out);     /* TCP at once */
	return shim_conn(out);
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	REAL(sendfile);
	struct conn *c = shim_conn_filling(out);
	ssize_t r;

	if (!c)
		return real_sendfile(out, in, off, count);
	r = tx_sendfile(c, out, in, off, count);
	if (r == SHIM_MOVED)
		hs_moved_follow(c);
	conn_put(c);
	return r == SHIM_MOVED ? real_sendfile(out, in, off, count) : shim_ret(r);
}

EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	return sendfile(out, in, off, count);
}

/*
 * splice() with an accelerated end.  Into the socket: the source (file or
 * pipe) is read straight into the ring, as sendfile.  Out of the socket:
 * peek, write what the destination takes, then consume exactly that, so a
 * full pipe never loses a byte.
 */
static ssize_t splice_out_of(struct conn *c, int fd, int out, size_t len, unsigned flags)
{
	char buf[65536];
	struct iovec iov = { buf, len < sizeof(buf) ? len : sizeof(buf) };
	/* SPLICE_F_NONBLOCK is about the pipe: the socket waits as its own
	 * O_NONBLOCK says, as tcp_splice_read does */
	ssize_t got = rx_recv(c, fd, &iov, 1, MSG_PEEK), put;

	(void)flags;

	if (got <= 0)
		return got;
	put = sys_write(out, buf, (size_t)got);
	if (put < 0)
		return -errno;
	if (put > 0) {
		iov.iov_len = (size_t)put;
		rx_recv(c, fd, &iov, 1, MSG_DONTWAIT);   /* the bytes are there: no wait */
	}
	return put;
}

EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                      unsigned int flags)
{
	REAL(splice);
	struct conn *c;
	ssize_t r;

	if ((c = shim_conn_filling(out)) != NULL) {
		r = tx_sendfile(c, out, in, (off_t *)off_in, len);
		if (r == SHIM_MOVED)
			hs_moved_follow(c);
		conn_put(c);
		if (r != SHIM_MOVED)
			return shim_ret(r);
		return real_splice(in, off_in, out, off_out, len, flags);
	}
	if ((c = shim_conn_reading(in, len, 0)) != NULL) {
		if (off_in) {
			conn_put(c);
			errno = ESPIPE;         /* as for any socket */
			return -1;
		}
		r = splice_out_of(c, in, out, len, flags);
		if (r == SHIM_MOVED)
			hs_moved_follow(c);
		conn_put(c);
		if (r != SHIM_MOVED)
			return shim_ret(r);
	}
	return real_splice(in, off_in, out, off_out, len, flags);
}
