/*
 * fdtab.h - the descriptor table: what each descriptor number of the
 * process is to smclo (a connection, a socket it watches, one of its own
 * hidden descriptors), and the descriptor budget.
 *
 * The process's descriptors as smclo sees them, kept apart from the
 * connection itself (conn.h): the data path (io.h) works on a struct conn
 * and never looks a descriptor up.  The handshake reads and sets these
 * entries directly (it sits above this layer); the front ends above it
 * (the shim, the native API, the hand-over) do too.
 */
#ifndef SMCLO_FDTAB_H
#define SMCLO_FDTAB_H

#include "conn.h"

/*
 * Per-descriptor knowledge about sockets that are not (yet) connections,
 * in one 16-bit word: what the handshake sets and reads...
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
#define FDF_PREFIX  16384u  /* pending, its first bytes to go over TCP (hs_send_prefix) */
#define FDF_CONNECTING 32768u /* a non-blocking connect() said EINPROGRESS: the next
                                 one says 0, as the kernel's does, later ones EISCONN */
#define FDF_EPOLL_LOST 8192u /* an epoll registration made before connect() the shim could
                                not record: it could not follow the switch (R_EPOLL_EARLY) */

/* ...and what the shim's epoll wrappers set and read (epoll_watch.c). */
#define FDF_EPOLL     16u   /* an epoll instance */
#define FDF_WATCHED   32u   /* registered in an epoll set epoll_watch.c tracks */
#define FDF_NESTED    64u   /* an epoll instance inside another one */
#define FDF_PARKED   256u   /* a registration of it was parked in some set once */

/*
 * A small descriptor limit (RLIMIT_NOFILE below 512): a connection that
 * holds more descriptors than a TCP one would make the program run out
 * where TCP would not (50 connections under a limit of 64).  Then
 * connections go lean (install.c, install_go_lean): the doorbell socket is all they hold.
 */
extern int fd_budget_small;
int fd_budget_is_small(void);
extern int fd_soft_limit;      /* RLIMIT_NOFILE's soft limit, as last seen */
/*
 * Set at the first fork: another process may now set options on sockets
 * this one made, so what the descriptor table knows of them (FDF_TIMEOUTS)
 * is no longer the whole story.
 */
extern _Atomic int fd_options_shared;

/*
 * The descriptor table (fdtab.c): one entry per descriptor number.  The two
 * lookups every wrapper makes are inline, so a plain descriptor costs a
 * bounds check and a load, with no call.
 */
struct fd_entry {
	_Atomic(struct conn *) conn;
	_Atomic uint16_t flags;
	_Atomic uint16_t kernel_accepts;        /* threads in accept()'s kernel wait (direct.c) */
	int listen_lock;                /* lock fd of our listener entry, +1 (0 = none) */
	/* epoll sets a not yet connected TCP socket was added to (shim/epoll_early.c):
	 * its connection is decided inside connect() and never goes direct */
	_Atomic uint16_t epoll_early;
	/* a descriptor of smclo's own (fd_hide): the file it names (see fd_is_ours) */
	_Atomic uint64_t ours_ino;
	_Atomic uint32_t ours_dev;
};
extern struct fd_entry *fdtab;
extern int fdtab_size;

int fdtab_init(void);
/* RLIMIT_NOFILE may have changed: place hidden descriptors, and budget, anew. */
void fd_limit_changed(void);

static inline struct fd_entry *fd_entry(int fd)
{
	return (fdtab && fd >= 0 && fd < fdtab_size) ? &fdtab[fd] : NULL;
}

static inline uint16_t fd_flags(int fd)
{
	struct fd_entry *e = fd_entry(fd);

	return e ? atomic_load_explicit(&e->flags, memory_order_relaxed) : 0;
}

void fd_set_flags(int fd, uint16_t flags);
/* Count an epoll registration of the not yet connected socket @fd (+1, -1;
 * 0: forget them all, the descriptor is closed). */
void fd_epoll_early(int fd, int delta);
static inline int fd_epoll_early_count(int fd)
{
	struct fd_entry *e = fd_entry(fd);

	return e ? atomic_load_explicit(&e->epoll_early, memory_order_relaxed) : 0;
}
void fd_add_flags(int fd, uint16_t flags);
void fd_clear_flags(int fd, uint16_t flags);       /* atomically, as fd_add_flags */
/* Threads in accept()'s kernel wait on @fd, after adding @delta (direct.c). */
int fd_kernel_accepts(int fd, int delta);
void fd_set_listen_lock(int fd, int lockfd);
int fd_take_listen_lock(int fd);
/*
 * Another of our descriptors for the listening socket @fd names (a dup:
 * php-fpm's workers move theirs to descriptor 0), holding no entry; -1.
 */
int fd_listener_copy(int fd);
/* Call @fn for every descriptor that holds a listener entry. */
void fd_for_each_listener(void (*fn)(int fd));

/* The connection behind @fd with a reference held, or NULL. */
struct conn *fd_get_conn(int fd);
/* Quick test without a reference, for the pass-through fast path. */
static inline int fd_has_conn(int fd)
{
	struct fd_entry *e = fd_entry(fd);

	return e && atomic_load_explicit(&e->conn, memory_order_acquire) != NULL;
}

/* Name @fd as a holder of @c (takes a reference). */
void fd_bind_conn(struct conn *c, int fd);
/* Forget @fd; returns its connection (reference transferred) or NULL. */
struct conn *fd_unbind_conn(int fd);
/* No descriptor above this number was ever known to the table. */
int fd_table_high(void);
/* Visit every bound descriptor (used by fork and exec handling). */
void fd_for_each_conn(void (*fn)(int fd, struct conn *c, void *arg), void *arg);
/* Move @fd above the application's range, close-on-exec; returns new fd. */
int fd_hide(int fd);
/* A hidden copy of @fd, or -1 (io_hooks.keep_copy): with @if_spare, only
 * if the descriptor budget allows and the copy lands in the hidden range. */
int fd_keep_copy(int fd, int if_spare);

/* A copy of @fd kept as one of smclo's own (in the hidden range if it can be). */
int fd_dup_hidden(int fd);
/*
 * Is @fd one of smclo's own descriptors (made by fd_hide or fd_dup_hidden)
 * and still open?  A program's close() loop, close_range() or closefrom()
 * must leave those alone: a daemon or an inetd child closing "everything"
 * before exec would otherwise take the registry, a connection's state and
 * its TCP socket from under smclo (its hand-over then fails), and a number
 * the kernel hands out again would be closed by smclo later.
 */
int fd_is_ours(int fd);
/* The first descriptor in [@from, @last] marked ours (fd_is_ours then tells
 * whether it still is), or -1. */
int fd_next_ours(unsigned from, unsigned last);
/* smclo is about to move or close @fd itself: it is no longer ours. */
void fd_forget_ours(int fd);
/* Whether @fd is above the application's range (the move can fall short). */
int fd_is_hidden(int fd);

/*
 * fdfork.c: the child of a fork holds every connection it inherits (one
 * more holder each, counted before the fork).  The fork handlers of
 * runtime/fork.c call prepare, parent and child; the shim's fork() brackets
 * the real one with begin and end (@failed: no child was made).
 */
void fdfork_prepare(void);
void fdfork_parent(void);
void fdfork_child(void);
void fdfork_begin(void);
void fdfork_end(int failed);

/*
 * Set once the library is up (runtime/init.c, fdtab_activate): 0 means
 * every wrapper passes everything through.
 */
extern int smclo_active;
void fdtab_activate(void);

#endif
