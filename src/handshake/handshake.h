/*
 * handshake.h - deciding, once, whether a TCP connection moves to shared
 * memory (see handshake.c).
 */
#ifndef SMCLO_HANDSHAKE_H
#define SMCLO_HANDSHAKE_H

#include <sys/socket.h>

/* connect() for a TCP socket: plain TCP, or TCP then the switch. */
int hs_connect(int fd, const struct sockaddr *sa, socklen_t len);
/*
 * After the kernel accepted @fd on @lfd from @peer (the address accept()
 * returned): returns the descriptor for the application.
 */
int hs_accept(int lfd, int fd, int flags, const struct sockaddr *peer, socklen_t peer_len);
/* After listen() succeeded. */
void hs_listen(int fd);
/* Before listen() on a socket bound to a port: 0 if announced. */
int hs_listen_bound(int fd);
void hs_listener_closed(int fd);
/*
 * The direct handshake (handshake.c): a listener whose process blocks in
 * accept() takes connections without TCP through its direct inbox.
 * accept() on listener @lfd: the descriptor of a direct connection (its
 * peer in *@peer), -1 with errno as accept() would fail, or HS_ACCEPT_KERNEL
 * when the kernel has a connection to accept (or the listener is not direct).
 */
#define HS_ACCEPT_KERNEL (-2)
struct ep;
int hs_accept_direct(int lfd, int flags, struct ep *peer);
/* A thread enters (+1) or leaves (-1) accept()'s wait in the kernel on @lfd. */
void hs_kernel_accept(int lfd, int delta);
/*
 * Listener @fd is used in a way a direct accept cannot follow (a readiness
 * call, O_NONBLOCK, a receive timeout): TCP only from now on.
 */
void hs_listener_no_direct(int fd);
struct conn;
/*
 * A connection whose offer is still undecided (handshake.c, "pending"):
 * decide it now, waiting at most until the handshake timeout.  @reading:
 * the caller is a blocking read of that many bytes, which would wait for
 * the server's answer next anyway (offer_wait_reading); 0 otherwise.
 */
void hs_resolve(int fd, struct conn *c, size_t reading);
/* The same for whatever @fd names, if it is pending. */
void hs_resolve_fd(int fd);
/* Decide every pending connection of this process (before fork and exec). */
void hs_resolve_all(void);
/* The process is about to take effective uid @euid (setuid and friends). */
void hs_user_changing(uid_t euid);
/* The process changed its root directory. */
void hs_chrooted(void);
/* In a fork child: the inherited listeners are now shared (see handshake.c). */
void hs_after_fork(void);

#endif
