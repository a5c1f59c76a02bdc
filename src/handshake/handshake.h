/*
 * handshake.h - the switch from TCP to shared memory (the kernel's CLC):
 * deciding, once, whether a TCP connection moves to shared memory.
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
 * counted in the preload shim's epoll_ctl); one made after, while a non-blocking
 * connect is still undecided, first decides it (hs_resolve_fd).
 *
 * The same-connection proof is proof.c's; the client's steps client.c's, the
 * server's server.c's, listeners' entries listener.c's and direct.c's, and
 * the connection either ends in install.c's.  Processes are told apart by
 * keys that hold across PID namespaces (peerid.h), never by a pid another
 * process wrote.
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
 * TCP_DEFER_ACCEPT was set on listener @fd after listen() (apache2's
 * AcceptFilter, pgbouncer): the kernel now wakes an acceptor only when a
 * client's first bytes come, and a client waiting for the handshake before
 * it sends would wait for a server waiting for it.  Its entry says so now
 * (it outranks the entries of the other processes sharing the listener), and
 * clients take TCP at once (defer-accept).
 */
void hs_listener_defers(int fd);
/*
 * The direct handshake (direct.c): a listener whose process blocks in
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
 * A connection whose offer is still undecided (client.c, "pending"):
 * decide it now, waiting at most until the handshake timeout.  @reading:
 * the caller is a blocking read of that many bytes, which would wait for
 * the server's answer next anyway (inbox_offer_wait_reading); 0 otherwise.
 */
void hs_resolve(int fd, struct conn *c, size_t reading);
/* The same for whatever @fd names, if it is pending. */
void hs_resolve_fd(int fd);
/*
 * A write on @fd, pending to a listener that defers accept with its first
 * bytes not sent yet (FDF_PREFIX): they go over TCP (tx_send_prefix).
 * Returns 1 when done here (*sent: bytes, or -1 with errno), 0 to write as
 * usual (the connection went to TCP, or another thread's write went first).
 * Until then every other call takes the descriptor for the TCP socket it
 * is: deciding would wait for a server nothing woke.
 */
int hs_send_prefix(int fd, const struct iovec *iov, int n, int flags, ssize_t *sent);
/* Decide every pending connection of this process (before fork and exec). */
void hs_resolve_all(void);
/*
 * Before a fork, first of all the fork handlers (runtime/fork.c): once this
 * process has made a pending connection, decide them all (hs_resolve_all).
 */
void hs_fork_decide(void);
/* The handshake's locks, held across fork() (direct.c's, then inbox.c's). */
void hs_fork_lock(void);
void hs_fork_unlock(void);
/* The process is about to take effective uid @euid (setuid and friends). */
void hs_user_changing(uid_t euid);
/* The process changed its root directory. */
void hs_chrooted(void);
/*
 * shim/uring.c made (@on) or is closing (!@on) the io_uring instance @fd
 * through liburing: its submissions are looked at, so the process may
 * accelerate (proof.c).  -1 if there is no room to remember it (it then
 * counts as unseen).
 */
int hs_uring_seen(int fd, int on);
/* Listener @fd accepts through io_uring, where no handshake is answered:
 * clients take TCP at once (listener.c). */
void hs_listener_unserved(int fd);
/* In a fork child: the inherited listeners are now shared (listener.c). */
void hs_after_fork(void);
/* Before an exec: entries naming the inbox shared with the parent, for listeners
 * the exec'd program keeps, made again without it (it does not cross exec). */
void hs_listeners_before_exec(void);
/* Before a spawn (posix_spawn: glibc's own clone execs the program, where no
 * code of ours runs): the same for the listeners @keeps says it keeps. */
void hs_listeners_before_spawn(int (*keeps)(int fd, const void *ctx), const void *ctx);

/*
 * moved.c: connections that go on over their TCP socket (core/move.c).
 * hs_moved_follow: @c was moved (move_seen): this process's descriptors of
 * it become its TCP socket, once; returns 1 while the ring still holds
 * bytes to read first, 0 once it does not (the connection is plain TCP to
 * this process from then on: MODE_TCP).
 * hs_sandbox: a seccomp filter is about to be installed (shim/seccomp.c):
 * every connection that can goes on over TCP now, before the filter could
 * refuse our system calls, and nothing new is accelerated.  Returns how
 * many connections could not (no TCP beneath: the direct handshake).
 * hs_sandboxed: was it?
 */
int hs_moved_follow(struct conn *c);
int hs_sandbox(void);
/* A descriptor limit of @lowest: connections whose numbers it leaves out
 * (no dup3 onto them after it) move now; returns how many could not. */
int hs_move_fds_from(int lowest);
/* Move @c to TCP now, for @reason (urgent data: TCP's own), and follow;
 * -1 if it cannot move (no TCP beneath). */
int hs_move_now(struct conn *c, int reason);
/*
 * @c (named @fd here) goes to a program that cannot take it over (an exec,
 * SCM_RIGHTS): move it, and make this process's descriptors of it the TCP
 * socket - what the ring still holds of the peer's stream (bytes, a
 * shutdown) the peer sends again over TCP first, asked and waited for, at
 * most the handshake timeout (core/move.c, "sent again").  0: the whole
 * stream is TCP's from here.  -1 if it cannot move, the peer closed, its
 * bytes include pool references, or it did not send them in time (the
 * caller resets the descriptor it hands on; moved or not).
 */
int hs_hand_on_tcp(int fd, struct conn *c);
int hs_sandboxed(void);
/* A connection of a sandboxed process, left on TCP: counted (R_SANDBOX). */
void hs_sandboxed_tcp(void);

/*
 * release.c: a descriptor of a connection closed.  When it was this
 * process's last one, the close is published, payoff.c learns what the
 * connection carried, the hidden TCP socket goes (its close put off), and an
 * undecided offer is withdrawn.
 */
void hs_release_fd(int fd);
/*
 * A program that cannot take the connection over gets @fd as a fresh,
 * unconnected TCP socket.  @leave: this process stops holding it (an exec
 * of the process itself; not a vfork child, whose parent goes on with it).
 */
void hs_release_for_exec(int fd, int leave);

#endif
