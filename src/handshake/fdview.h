/*
 * fdview.h - what the handshake knows of the process's descriptors, and how
 * it asks.
 *
 * The descriptor table belongs to the front end above (the preload shim's
 * fdtab.c); the handshake reads and sets a descriptor's state (the flags
 * below), binds connections to descriptor numbers and keeps a listener's
 * registry lock beside it - all through these hooks, which the front end
 * registers once at start (hs_set_fd_hooks), before it hands the handshake
 * any socket.  So calls go only downward, and the handshake can be linked
 * under another front end (the native API's, a test's) that keeps its
 * descriptors its own way.
 */
#ifndef SMCLO_FDVIEW_H
#define SMCLO_FDVIEW_H

#include <stdint.h>

/*
 * A descriptor's state as the handshake sees it; the table keeps these in
 * one 16-bit word per descriptor beside the front end's own (fdtab.h).
 */
#define FDF_TCP        1u   /* an AF_INET/AF_INET6 stream socket we saw created */
#define FDF_SMC        2u   /* created as AF_SMC */
#define FDF_LISTENING  4u   /* registered as a listener */
#define FDF_KNOWN      8u   /* flags above are authoritative */
#define FDF_PENDING  128u   /* a connection whose handshake is not decided yet */
#define FDF_INET6    512u   /* with FDF_KNOWN: an AF_INET6 socket (else AF_INET) */
#define FDF_DIRECT  1024u   /* a listener taking connections without TCP (direct.c) */
#define FDF_NO_DIRECT 2048u /* a listener that never will (hs_listener_no_direct) */
#define FDF_TIMEOUTS 4096u  /* SO_RCVTIMEO/SO_SNDTIMEO may be set: ask the kernel (sockopt.c) */

struct conn;

struct hs_fd_hooks {
	uint16_t (*flags)(int fd);
	void (*set_flags)(int fd, uint16_t flags);
	void (*add_flags)(int fd, uint16_t flags);
	/* name @fd as a holder of @c (takes a reference) */
	void (*bind_conn)(struct conn *c, int fd);
	/* the connection behind @fd with a reference held, or NULL */
	struct conn *(*get_conn)(int fd);
	/* call @fn for every descriptor bound to a connection */
	void (*for_each_conn)(void (*fn)(int fd, struct conn *c, void *arg), void *arg);
	/* epoll registrations made of @fd before it connected */
	int (*epoll_early)(int fd);
	/* threads in accept()'s kernel wait on listener @fd, after adding
	 * @delta to their count (an atomic, sequentially consistent add) */
	int (*kernel_accepts)(int fd, int delta);
	/* the registry lock descriptor kept with listener @fd (-1: none);
	 * take_listen_lock also forgets it */
	void (*set_listen_lock)(int fd, int lockfd);
	int (*take_listen_lock)(int fd);
	void (*for_each_listener)(void (*fn)(int fd));
	/* @fd, one of smclo's own until now (io_keep_fd), is the program's */
	void (*release_kept)(int fd);
	/* the process runs under a small descriptor budget (fdtab.h) */
	int (*budget_small)(void);
	/* carry SO_RCVTIMEO/SO_SNDTIMEO of TCP socket @from_tcp over to the
	 * doorbell socket @to_unix: the receive timeout in ms (sockopt.c) */
	int (*copy_timeouts)(int from_tcp, int to_unix);
	/* might @fd have a timeout set (else the kernel need not be asked)? */
	int (*may_have_timeouts)(int fd);
};
void hs_set_fd_hooks(const struct hs_fd_hooks *h);

#endif
