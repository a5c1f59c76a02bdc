/*
 * sockopt.h - socket identity after the switch (see sockopt.c).
 */
#ifndef SMCLO_SOCKOPT_H
#define SMCLO_SOCKOPT_H

#include "conn.h"

#include <sys/socket.h>

/* kernel TLS's option level and its receive key (linux/tls.h), not in every libc */
#ifndef SOL_TLS
#define SOL_TLS 282
#endif
#ifndef TLS_RX
#define TLS_RX 2
#endif

/*
 * getsockopt(), setsockopt(), getsockname()/getpeername() (@peer) and
 * ioctl() on accelerated connection @c, descriptor @fd: 0 or -errno.  The
 * ioctl says in *@handled whether it answered; if not, the kernel does.
 */
int sockopt_get(struct conn *c, int fd, int level, int opt, void *val, socklen_t *len);
int sockopt_set(struct conn *c, int fd, int level, int opt, const void *val, socklen_t len);
int sockopt_name(struct conn *c, int peer, struct sockaddr *sa, socklen_t *len);
int sockopt_ioctl(struct conn *c, unsigned long req, void *arg, int *handled);

/*
 * Would the kernel set upper layer protocol @val (TCP_ULP) on a connected
 * TCP socket?  Asked of a scratch socket, never of a connection's own: 0
 * if so, else the -errno the connection would get (ENOENT: no such
 * protocol here; EOPNOTSUPP: not one a program may set).
 */
int sockopt_ulp_probe(const void *val, socklen_t len);

/*
 * Whether socket @fd may have SO_RCVTIMEO/SO_SNDTIMEO set: not when this
 * process made it and nobody set one since (FDF_TIMEOUTS, fd_options_shared).
 */
int sockopt_may_have_timeouts(int fd);
/* Carry timeouts set on the TCP socket over to the doorbell socket; returns SO_RCVTIMEO in ms. */
int sockopt_copy_timeouts(int from_tcp, int to_unix);
/* SO_RCVTIMEO of the doorbell socket @fd in ms (0: none), looked up once per setting. */
int sockopt_rcvtimeo_ms(struct conn *c, int fd);

#endif
