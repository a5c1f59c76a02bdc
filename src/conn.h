/*
 * conn.h - an accelerated (or deliberately not accelerated) connection.
 *
 * The application's descriptor is the AF_UNIX SOCK_SEQPACKET end that links
 * us to the peer process: the kernel reports its readiness, wakes blocked
 * calls, and hangs it up when the peer goes away.  Bytes travel through two
 * rings (ring.h): `tx`, which we own and write, and `rx`, the peer's, mapped
 * read-only.  The real TCP socket stays open, moved to a high descriptor, so
 * that the socket keeps its identity (options, addresses, TCP_INFO).
 *
 * State that every holder of the connection must agree on (cursors, locks,
 * holders count) lives in `struct conn_shared`, a slot of a shared memfd
 * (shared.c): after fork, parent and child use one set of cursors, so the
 * byte stream stays intact whichever process reads or writes, and a program
 * exec'd with the connection maps the same slot again (handover.c).
 */
#ifndef SMCLO_CONN_H
#define SMCLO_CONN_H

#include "addr.h"
#include "ring.h"
#include "stats.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define SH_SHUT_RD   1u
#define SH_SHUT_WR   2u
#define SH_BROKEN    4u     /* the peer broke the protocol: reset */
#define SH_PEER_GONE 8u     /* the doorbell socket hung up: the peer is gone */
#define SH_PEER_SHUT 16u    /* the peer shut down its sending side (half-close) */
#define SH_ABORT_AT_CLOSE 32u /* passed to a program that could not take it (passfd.c):
                                 the peer hears a reset when it ends, not an EOF */

struct conn_shared {
	pthread_mutex_t tx_lock;        /* robust, process-shared */
	pthread_mutex_t rx_lock;
	uint64_t prod;                  /* bytes we produced (authoritative copy) */
	uint64_t cons;                  /* bytes we consumed from the peer */
	uint64_t cons_pub;              /* last cons published to our region */
	uint64_t cons_woke;             /* cons when we last woke a blocked writer */
	uint64_t peer_prod_seen;        /* last validated peer producer cursor */
	uint64_t peer_cons_seen;        /* last validated peer consumer cursor */
	uint64_t bell_seq;              /* doorbells we sent */
	uint64_t bell_last_val;         /* prod carried by the last one */
	uint64_t bells_drained;         /* the peer's doorbells we consumed */
	_Atomic int holders;            /* processes that hold the connection */
	_Atomic uint32_t flags;         /* SH_* */
	_Atomic int nonblock;           /* O_NONBLOCK of the shared file, kept by our
	                                   fcntl/ioctl wrappers: no syscall per wait */
	_Atomic int rcvtimeo_ms;        /* SO_RCVTIMEO of the doorbell socket, +1
	                                   (0: not looked up since it was last set) */
	_Atomic uint32_t slot_state;    /* shared.c's bookkeeping */
};

/* Which thread of which process holds a lock between two calls, and how much. */
struct io_hold {
	_Atomic(const void *) thread;   /* a thread-local address of the holder */
	pid_t pid;
	size_t len;                     /* bytes claimed or peeked */
};

struct conn {
	_Atomic int refs;
	int fd_count;                   /* descriptors of this process naming it */
	int mode;                       /* MODE_SHM or MODE_TCP */
	int tcp_fd;                     /* hidden TCP socket (shm mode), or -1 */
	/*
	 * Set up without a TCP connection (the direct handshake, handshake.c):
	 * the hidden socket, if any, is not connected, and the addresses are
	 * the ones recorded below.
	 */
	int direct;
	int inherited;                  /* came to this process through fork */
	unsigned fork_gen;              /* last fork that counted us as a holder */
	int domain;                     /* what SO_DOMAIN answers (AF_INET/6/AF_SMC) */
	unsigned long bell_ino;         /* the doorbell socket's inode: names the connection
	                                   in any process (handover.c), 0 until known */
	struct region *region;          /* the shared memory both rings live in */
	struct ring_hdr *tx;            /* our ring inside it */
	const struct ring_hdr *rx;      /* the peer's */
	uint32_t tx_size, rx_size;
	struct conn_shared *sh;
	int reusable;                   /* every holder in every process is gone */
	struct stat_slot *slot;
	struct ep local, peer;
	int watch_regs;                 /* epoll registrations watch.c tracks for it */
	_Atomic uint32_t calls;         /* reads and writes that moved data (payoff.h) */
	/*
	 * A client connection whose inbox offer is not decided yet (handshake.c,
	 * "pending"): the descriptor is still the TCP socket, writes that fit go
	 * into the ring with doorbells on bell_fd, everything else decides first.
	 */
	_Atomic int pending;            /* PENDING_* */
	int bell_fd;                    /* pending: our end of the socket pair */
	long pending_until_ms;          /* pending: when the client withdraws */
	/*
	 * A claim of our ring (tx_claim) or a peek at the peer's (rx_peek)
	 * outstanding: its thread holds the transmit or receive lock until the
	 * commit or consume (io.h).  Who holds it is a thread of one process.
	 */
	struct io_hold tx_hold, rx_hold;
};

/* One more read or write moved data: a lossy count, no locked instruction. */
static inline void conn_count_call(struct conn *c)
{
	atomic_store_explicit(&c->calls, atomic_load_explicit(&c->calls, memory_order_relaxed) + 1,
	                      memory_order_relaxed);
}

#define PENDING_NONE      0
#define PENDING_OPEN      1
#define PENDING_DECIDING  2

/* Per-descriptor knowledge about sockets that are not (yet) connections. */
#define FDF_TCP        1u   /* an AF_INET/AF_INET6 stream socket we saw created */
#define FDF_SMC        2u   /* created as AF_SMC */
#define FDF_LISTENING  4u   /* registered as a listener */
#define FDF_KNOWN      8u   /* flags above are authoritative */
#define FDF_EPOLL     16u   /* an epoll instance (watch.c) */
#define FDF_WATCHED   32u   /* registered in an epoll set watch.c tracks */
#define FDF_NESTED    64u   /* an epoll instance inside another one */
#define FDF_PENDING  128u   /* a connection whose handshake is not decided yet */
#define FDF_PARKED   256u   /* a registration of it was parked in some set once (watch.c) */
#define FDF_INET6    512u   /* with FDF_KNOWN: an AF_INET6 socket (else AF_INET) */
#define FDF_DIRECT  1024u   /* a listener taking connections without TCP (handshake.c) */
#define FDF_NO_DIRECT 2048u /* a listener that never will (hs_listener_no_direct) */
#define FDF_TIMEOUTS 4096u  /* SO_RCVTIMEO/SO_SNDTIMEO may be set: ask the kernel (sockopt.c) */

/* Library-wide state set up by the constructor. */
extern int smclo_active;       /* 0: pass everything through */
extern int registry_fd;        /* -1 when the registry is unusable */
/*
 * A small descriptor limit (RLIMIT_NOFILE below 512): a connection that
 * holds more descriptors than a TCP one would make the program run out
 * where TCP would not (50 connections under a limit of 64).  Then
 * connections go lean (conn_go_lean): the doorbell socket is all they hold.
 */
extern int fd_budget_small;
extern int fd_soft_limit;      /* RLIMIT_NOFILE's soft limit, as last seen */
extern struct stats_totals *totals;
/*
 * Set at the first fork: another process may now set options on sockets
 * this one made, so what the descriptor table knows of them (FDF_TIMEOUTS)
 * is no longer the whole story.
 */
extern _Atomic int fd_options_shared;

/*
 * The descriptor table (conn.c): one entry per descriptor number.  The two
 * lookups every wrapper makes are inline, so a plain descriptor costs a
 * bounds check and a load, with no call.
 */
struct fd_entry {
	_Atomic(struct conn *) conn;
	_Atomic uint16_t flags;
	_Atomic uint16_t kernel_accepts;        /* threads in accept()'s kernel wait (handshake.c) */
	int listen_lock;                /* lock fd of our listener entry, +1 (0 = none) */
	/* epoll sets a not yet connected TCP socket was added to (preload.c,
	 * epoll_ctl): its connection stays on TCP (R_EPOLL_EARLY) */
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
void fd_set_listen_lock(int fd, int lockfd);
int fd_take_listen_lock(int fd);
/* Call @fn for every descriptor that holds a listener entry. */
void fd_for_each_listener(void (*fn)(int fd));

/* The connection behind @fd with a reference held, or NULL. */
struct conn *conn_get(int fd);
void conn_put(struct conn *c);
/* Quick test without a reference, for the pass-through fast path. */
static inline int fd_has_conn(int fd)
{
	struct fd_entry *e = fd_entry(fd);

	return e && atomic_load_explicit(&e->conn, memory_order_acquire) != NULL;
}

struct conn *conn_alloc(int mode);
/*
 * Under a small descriptor budget, once @c is set up: close its hidden TCP
 * socket (names from the handshake, options on a socket made on demand, as
 * for a direct connection) and the region descriptor it keeps (no reuse,
 * no exec handover for it).
 */
void conn_go_lean(struct conn *c);
/* @fd is the doorbell socket of @c now: remember its inode (bell_ino). */
void conn_note_bell(struct conn *c, int fd);
/* Name @fd as a holder of @c (takes a reference). */
void conn_bind_fd(struct conn *c, int fd);
/* Forget @fd; returns its connection (reference transferred) or NULL. */
struct conn *conn_unbind_fd(int fd);
/* No descriptor above this number was ever known to the table. */
int fd_table_high(void);
/* Visit every bound descriptor (used by fork and exec handling). */
void conn_for_each_fd(void (*fn)(int fd, struct conn *c, void *arg), void *arg);
int conn_count(void);

/*
 * State shared by the processes holding a connection (shared.c): fork
 * children inherit it, exec'd programs map it again.
 */
struct conn_shared *conn_shared_new(void);
/* This process is done with @sh; @reusable: so is every other holder. */
void conn_shared_put(struct conn_shared *sh, int reusable);
/* The descriptor and offset that map @sh again (for a handover); -1 if none. */
int conn_shared_locate(const struct conn_shared *sh, int *fd, uint32_t *offset);
/* @sh as another program of this process left it (handover.c); NULL if invalid. */
struct conn_shared *conn_shared_adopt(int fd, uint32_t offset);

/* Move @fd above the application's range, close-on-exec; returns new fd. */
int fd_hide(int fd);
/* The same, keeping @fd open. */
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

/* Lock helpers that survive a holder dying (robust mutexes). */
void sh_lock(pthread_mutex_t *m);
void sh_unlock(pthread_mutex_t *m);

#endif
