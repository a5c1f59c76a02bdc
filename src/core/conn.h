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
#include "registry.h"
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
#define SH_MOVED     64u    /* the stream goes on over the TCP socket (move.c) */
#define SH_ABORT_AT_CLOSE 32u /* passed to a program that could not take it (passfd.c):
                                 the peer hears a reset when it ends, not an EOF */
#define SH_LINGER_ABORT 128u  /* SO_LINGER {1, 0}: closing is an abort (a reset) */
#define SH_RESEND    256u   /* we asked the peer to send again over TCP what we had not
                               read of its stream: the ring holds nothing more for us */
#define SH_RESENT    512u   /* we sent again what the peer asked for (move.c) */
#define SH_RESEND_FAILED 1024u /* ...and could not: a hole in the stream, reset */
#define SH_RESENDING 2048u  /* ...and have begun: resend_next says how far */
#define SH_UNASKED   4096u  /* moved with nothing asked: our bytes may be on TCP, so
                               nothing can be sent again in front of them */

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
	uint64_t ref_prod;              /* pool references we sent (ring_hdr.ref) */
	uint64_t ref_end;               /* just past the placeholder of the last one */
	uint64_t ref_cons;              /* the peer's references we consumed */
	uint64_t resend_next;           /* the next of our bytes to send again (move.c) */
	uint32_t ref_skip;              /* bytes taken of the one at our cursor */
	_Atomic uint32_t at_seq;        /* odd while cons, ref_cons, ref_skip change
	                                   (rx.c: counted without the lock) */
	_Atomic uint32_t pool_made;     /* a pool was made for sending on it (pool.c) */
	_Atomic int holders;            /* processes that hold the connection */
	_Atomic uint32_t flags;         /* SH_* */
	_Atomic int nonblock;           /* O_NONBLOCK of the shared file, kept by our
	                                   fcntl/ioctl wrappers: no syscall per wait */
	_Atomic int rcvtimeo_ms;        /* SO_RCVTIMEO of the doorbell socket, +1
	                                   (0: not looked up since it was last set) */
	_Atomic uint32_t slot_state;    /* shared.c's bookkeeping */
	_Atomic uint32_t reset;         /* reset, and the error still pending (tcpend.c) */
	_Atomic uint32_t rcvlowat;      /* SO_RCVLOWAT as the program set it (0: 1) */
	_Atomic uint32_t nospace;       /* writes that found the ring full (TCP's
	                                   SOCK_NOSPACE): the room after each is an
	                                   edge-triggered EPOLLOUT (epoll_watch.c) */
};

/* Which thread of which process holds a lock between two calls, and how much. */
struct io_hold {
	_Atomic(const void *) thread;   /* a thread-local address of the holder */
	pid_t pid;
	size_t len;                     /* bytes claimed or peeked */
};

/*
 * One connection in this process, the object every layer works on.  The
 * core owns the rings and the shared state; the fields the layers above
 * write are theirs to keep right: fd_count, inherited and fork_gen the
 * descriptor table's (fd/), tcp_fd, direct, pending, bell_fd and the
 * addresses the handshake's, watch_regs the shim's epoll (epoll_watch.c).
 */
#define CONN_PREFIX_WAIT (1ull << 63)

struct conn {
	_Atomic int refs;
	int fd_count;                   /* descriptors of this process naming it */
	int mode;                       /* MODE_SHM or MODE_TCP */
	int tcp_fd;                     /* hidden TCP socket (shm mode), or -1 */
	/*
	 * Set up without a TCP connection (the direct handshake, direct.c):
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
	int watch_regs;                 /* epoll registrations epoll_watch.c tracks for it */
	/* moved to TCP (move.c), and this process's descriptors are the TCP
	 * socket now (handshake/moved.c) */
	_Atomic int moved_here;
	_Atomic uint32_t messages;      /* turns of direction among the reads and writes
	                                   that moved data (payoff.h) */
	_Atomic uint8_t last_dir;       /* the last of them: 0 none, CONN_READ, CONN_WRITE */
	/*
	 * A client connection whose inbox offer is not decided yet (client.c,
	 * "pending"): the descriptor is still the TCP socket, writes that fit go
	 * into the ring with doorbells on bell_fd, everything else decides first.
	 */
	_Atomic int pending;            /* PENDING_* */
	int bell_fd;                    /* pending: our end of the socket pair */
	long pending_until_ms;          /* pending: when the client withdraws */
	/*
	 * Pending to a listener that defers accept (TCP_DEFER_ACCEPT): the
	 * kernel wakes the server only at the client's first bytes, so those go
	 * over TCP (tx_send_prefix), and the server moves them into the ring's
	 * head when it takes the offer.  tcp_prefix: 0 no such thing; else the
	 * bytes sent so, with CONN_PREFIX_WAIT until the first write.
	 */
	_Atomic uint64_t tcp_prefix;
	/* ...and its offer, sent with those bytes (handshake/client.c owns it) */
	struct hs_unsent *unsent;
	/*
	 * A claim of our ring (tx_claim) or a peek at the peer's (rx_peek)
	 * outstanding: its thread holds the transmit or receive lock until the
	 * commit or consume (io.h).  Who holds it is a thread of one process.
	 */
	struct io_hold tx_hold, rx_hold;
	/*
	 * The peer's buffer pool (peerpool.c), mapped read-only in this process
	 * once the peer handed it over with a doorbell, its memfd (kept, hidden,
	 * for a program we exec or pass the connection to: handover.c), and
	 * the descriptor that tells the peer we released one of its buffers;
	 * NULL / -1 until then.
	 */
	const uint8_t *rx_pool;
	uint64_t rx_pool_len;
	int rx_pool_fd;
	int pool_wake_fd;
};

/*
 * One more read or write (@dir: CONN_READ, CONN_WRITE) moved data.  Counted
 * are the messages - the turns of direction: an answer read in eight
 * pieces is one, as it is one for the peer that wrote it.  A lossy count,
 * no locked instruction.
 */
#define CONN_READ  1
#define CONN_WRITE 2
static inline void conn_count_call(struct conn *c, uint8_t dir)
{
	if (atomic_load_explicit(&c->last_dir, memory_order_relaxed) == dir)
		return;
	atomic_store_explicit(&c->last_dir, dir, memory_order_relaxed);
	atomic_store_explicit(&c->messages,
	                      atomic_load_explicit(&c->messages, memory_order_relaxed) + 1,
	                      memory_order_relaxed);
}

#define PENDING_NONE      0
#define PENDING_OPEN      1
#define PENDING_DECIDING  2

struct conn *conn_alloc(int mode);
/* Drop a reference; the last one recycles the object (and its region). */
void conn_put(struct conn *c);
/*
 * Take a reference to @c if it has any left (0: it is being freed, and may
 * be recycled; a pointer read without a reference, as a walk of the
 * descriptor table reads it, may name such a connection).
 */
int conn_try_ref(struct conn *c);
/* Drop a reference unless it is the last (0: it is, and is still held). */
int conn_put_unless_last(struct conn *c);
/* @fd is the doorbell socket of @c now: remember its inode (bell_ino). */
void conn_note_bell(struct conn *c, int fd);
int conn_count(void);

/*
 * State shared by the processes holding a connection (shared.c): fork
 * children inherit it, exec'd programs map it again.
 */
struct conn_shared *shared_new(void);
/* This process is done with @sh; @reusable: so is every other holder. */
void shared_put(struct conn_shared *sh, int reusable);
/* The descriptor and offset that map @sh again (for a handover); -1 if none. */
int shared_locate(const struct conn_shared *sh, int *fd, uint32_t *offset);
/* @sh as another program of this process left it (handover.c); NULL if invalid. */
struct conn_shared *shared_adopt(int fd, uint32_t offset);

/* Lock helpers that survive a holder dying (robust mutexes). */
void shared_lock(pthread_mutex_t *m);
void shared_unlock(pthread_mutex_t *m);

/* The connection objects' lock, held across fork() (runtime/fork.c lists the order). */
void conn_fork_lock(void);
void conn_fork_unlock(void);
/* The shared-state chunks' lock, held across fork() (runtime/fork.c lists the order). */
void shared_fork_lock(void);
void shared_fork_unlock(void);

#endif
