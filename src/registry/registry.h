/*
 * registry.h - the directory through which smclo processes find each other.
 *
 * Layout under SMCLO_DIR (default /dev/shm/smclo-<uid>, mode 0700):
 *   l/<port>.<netns>.<ip>.<flags>.<pid>.<inbox>.<direct>.<tx>.<rx>.<rand>
 *                                                a listener; locked while alive
 *   i/<pid>.<inbox>                              a listening process's inbox, or a
 *                                                listener's direct inbox
 *   p/<dstport>-<srcport>-<dstip>                a client's rendezvous socket
 *   c/<pid>.<rand>                                a process's connection table
 *   t/<uid>                                       a user's totals since creation/reset
 *   state3                                        shared counters (rendezvous bound, offers
 *                                                 sent, listeners added) and what connections
 *                                                 to a destination were like
 *
 * Liveness is an open-file-description lock held by the owner: it is
 * inherited over fork, released by the kernel when the last holder exits,
 * and visible across PID namespaces, so a crashed owner is noticed without
 * trusting process ids.
 */
#ifndef SMCLO_REGISTRY_H
#define SMCLO_REGISTRY_H

#include "addr.h"

#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define LISTEN_F_V6ONLY 1u
#define LISTEN_F_DEFER  2u
#define LISTEN_F_PREFIX 8u      /* takes a client's first bytes from TCP (CLC_OFFER_F_TCP_PREFIX):
                                   servers of older versions would take such an offer
                                   and leave them there */
#define LISTEN_F_UNREACHABLE 4u /* whoever accepts here changed to a user who cannot
                                   use the registry: clients stay on TCP at once */

/* "<sub>/<name>", an entry's path relative to the registry directory. */
#define REGISTRY_PATH_MAX 300
int registry_entry_path(char out[REGISTRY_PATH_MAX], const char *sub, const char *name);
void registry_entry_remove(int dirfd, const char *sub, const char *name);

/*
 * Open (creating if needed) the registry @dir; returns a directory fd or -1.
 * The default (@is_default) is the host's shared registry, SMCLO_SHARED_DIR,
 * if it is root's and sticky throughout (root makes it when missing), and
 * otherwise this user's own (config_private_dir, 0700): then only this
 * user's peers are found, and registry_private_why() says why.
 */
int registry_open(const char *dir, int is_default, char *err, size_t errlen);
const char *registry_private_why(void);     /* NULL: not on the private fallback */

/* 64 random bits (getrandom, else pid and time): names, not secrets. */
uint64_t registry_random64(void);

/* Whether users other than the registry's owner may write to it (its mode). */
int registry_is_shared(void);

/*
 * Open (creating if needed) a file whose pages are going to be mapped
 * shared: only if it is a regular file owned by @owner that nobody else may
 * write.  Whoever can write a file can truncate it, and touching a mapping
 * of a truncated file is a SIGBUS: a peer must not be able to crash us.
 * Returns an O_RDWR fd, or -1 (EPERM: the file is not safe to map).
 */
int registry_open_mappable(int dirfd, const char *path, uid_t owner);

/*
 * Open @path under @dirfd to read it: only a regular file, and without
 * waiting (whoever may write the registry could leave a FIFO there, whose
 * open would wait for a writer forever).  -1 (EPERM: not a regular file).
 */
int registry_open_read(int dirfd, const char *path);

/*
 * Map the first @len bytes of @fd (from registry_open_mappable) shared,
 * read-write, after making the filesystem back every page of them: a file
 * grown with ftruncate is sparse, and the first store into a page a full
 * tmpfs cannot back raises SIGBUS in the application.  Returns NULL (errno
 * set, ENOSPC for a full filesystem) when the pages cannot be had.
 */
void *registry_map_backed(int fd, size_t len);

/*
 * Could a process whose effective uid is @uid still create entries and
 * reach sockets in the registry (the directory's owner and mode)?  Group
 * permissions are not counted: a no costs only a TCP connection.
 */
int registry_usable_by(uid_t uid);

/* Lock files: create @name under @sub and hold an OFD lock; returns fd. */
int registry_lock_create(int dirfd, const char *sub, const char *name);
/* Remove the entry under @sub whose lock we hold as @lock, and close that. */
void registry_lock_remove(int dirfd, const char *sub, int lock);
/* 1 if someone holds the lock on @sub/@name, 0 if not, -1 if it is gone. */
int registry_is_locked(int dirfd, const char *sub, const char *name);

/*
 * Listener entries.  An entry names the inbox of the process that made it
 * (0: none, e.g. the entry a fork child adds for the listener it inherited)
 * and that process's ring sizes, for the one-message handshake (inbox.h);
 * and, while the listener takes connections without TCP, its direct inbox
 * (0: none; direct.c, the direct handshake).
 */
struct listener_offer {
	uint64_t inbox;
	uint64_t direct;
	uint32_t tx_size, rx_max;
	int inbox_pid;          /* the pid in the inbox's name, if not the writer's (a
	                           fork child naming its parent's inbox: inbox.c) */
};
int registry_listener_add(int dirfd, const struct ep *addr, uint64_t netns, unsigned flags,
                          const struct listener_offer *offer);

/*
 * What the entries for an address say, in rank order: of several entries
 * (processes that accept there), the highest decides.  One that defers
 * accept outranks those that do not: TCP_DEFER_ACCEPT belongs to the
 * listening socket, which the processes share, so one saying so is enough.
 */
enum listener_match {
	LM_NONE,          /* nothing listens on the port through smclo */
	LM_ELSEWHERE,     /* something does, but not at this address / namespace */
	LM_UNVERIFIED,    /* it does, but the entry's writer is not the listening socket's
	                     owner: anyone may write an entry (registry_listener_find) */
	LM_SAME_NETNS,
	LM_OTHER_NETNS,
	LM_DEFER,         /* it does, with TCP_DEFER_ACCEPT, and more than one process
	                     accepts there (one: LM_SAME_NETNS, info->defers) */
	LM_UNREACHABLE,   /* an acceptor there cannot use the registry (LISTEN_F_UNREACHABLE),
	                     or we may not read the listeners' entries (EACCES) */
};
struct listener_info {
	enum listener_match m;
	/* LM_SAME_NETNS: one process (pid) accepts there, through this inbox
	 * (and offer.direct, when every entry names that one) */
	int exclusive;
	int defers;             /* ...and its listening socket defers accept */
	int pid;
	uid_t owner;            /* who wrote its entry, and so made its inbox */
	struct listener_offer offer;
};
/*
 * What the live entries for @dst say.  Another user's entry counts as an
 * acceptor only when the kernel says that user owns the listening socket
 * (sock_diag, in our namespace); root's and trusted users' always do
 * (config_uid_trusted).
 */
void registry_listener_find(int dirfd, const struct ep *dst, uint64_t my_netns,
                            struct listener_info *info);
/* A live listener entry, as `smclo stat --listening` lists it. */
struct registry_listener {
	struct ep addr;         /* the address it listens on, and the port */
	unsigned flags;         /* LISTEN_F_* */
	int pid;
	uint64_t netns;
	struct listener_offer offer;
};
/* Call @fn for every listener entry whose owner still holds it. */
void registry_listeners_each(int dirfd, void (*fn)(const struct registry_listener *, void *),
                             void *arg);
/*
 * 1 if this process's last look found no listener entry at all on @port
 * and no listener has been added to the registry since: the answer
 * registry_listener_find would give (LM_NONE), without a system call.  The
 * registry's shared page counts listeners added, after each entry is made;
 * a look reads the count before it lists l/, so a listener added during the
 * look moves the count past what the answer was stored with.  Always 0 in a
 * shared registry (nothing is counted there).  A writer who holds the count
 * still keeps clients on TCP (lossless), like every count in that page.
 */
int registry_port_unlistened(int dirfd, uint16_t port);

/*
 * Rendezvous: before its SYN leaves, a client binds an AF_UNIX datagram
 * socket under p/ named by the connection's tuple as the server will see it;
 * the server that accepts the connection sends its answer there.
 */
void registry_rendezvous_key(char *out, size_t len, const struct ep *dst, uint16_t src_port);
/* Bind p/<key>; returns the socket, or -1 (errno EADDRINUSE: the tuple is taken). */
int registry_rendezvous_bind(int dirfd, const char *key);
/*
 * The rendezvous socket for @key, as an O_PATH descriptor, and the uid that
 * bound it; -1 if there is none.
 */
int registry_rendezvous_open(int dirfd, const char *key, uid_t *owner);
/* sendmsg() @mh to the socket @pathfd names, through the unbound datagram socket @sock. */
ssize_t registry_rendezvous_send(int pathfd, int sock, const struct msghdr *mh);
void registry_rendezvous_remove(int dirfd, const char *key);
/*
 * How many clients have a rendezvous bound, kept in the registry's shared
 * `state3` page: a client counts itself in before it binds and out after it
 * removed the socket, before its SYN and after its decision, so a server
 * that sees zero after accept() knows nobody waits under p/ for it and skips
 * the lookup.  A client that crashed in between leaves the count above zero,
 * which only costs servers the lookup they would have made anyway; a client
 * that cannot count itself in (no shared page) must not bind one.  In a
 * shared registry (registry_is_shared) nothing is counted: the page is not
 * shared (registry.c), counting succeeds doing nothing and servers always look.
 */
int registry_rendezvous_count(int dirfd, int delta);     /* -1: no shared page */
int registry_rendezvous_any(int dirfd);
/*
 * How many offers have been sent to any inbox, in the same page: a client
 * counts its offer after sendmsg() queued it and before its SYN.  So a
 * server that found its inbox empty after reading the count as N, and
 * reads N again after accept(), knows its inbox is still empty and skips
 * the recvmsg().  Only ever a hint: a writer who holds the count still
 * makes clients wait their handshake timeout and stay on TCP.  Returns 1
 * in a shared registry: offers are not counted there, servers always read.
 */
int registry_offers_sent(int dirfd, uint64_t *n);       /* -1: no shared page */
void registry_offer_count(int dirfd);

/*
 * The same page holds what clients learnt about how long their connections
 * to each destination were (payoff.c), so that a process making a single
 * connection (a curl in a shell loop) profits from what the ones before it
 * saw.  Direct-mapped by a hash of the destination; any process that may
 * write the registry can rewrite it, which only changes whether a
 * connection is offered acceleration: every field is a number compared
 * with a bound, never an index or a size.  In a shared registry the page is
 * the process's own, and so is what it learns.
 */
#define REGISTRY_DESTS 64
struct registry_dest {
	_Atomic uint64_t key;           /* hash of the destination; 0: free */
	_Atomic uint32_t streak;        /* short connections in a row */
	_Atomic uint32_t declined;      /* kept on TCP since the last probe */
	_Atomic uint32_t probed_ms;     /* when the last probe went, monotonic ms mod 2^32 */
};
struct registry_dest *registry_dests(int dirfd);        /* NULL: no shared page */

/*
 * Inboxes (inbox.h): a listening process binds i/<name>; a client connects a
 * datagram socket to it, learning the uid that bound it (the same file it
 * connected to, or -1).
 */
int registry_inbox_bind(int dirfd, const char *name);
int registry_inbox_connect(int dirfd, const char *name, uid_t *owner);
void registry_inbox_remove(int dirfd, const char *name);

/* "/proc/self/fd/<dirfd>/<sub>/<name>", short enough for sun_path. */
int registry_sun_path(int dirfd, const char *sub, const char *name, char *out, size_t len);

/*
 * Call @fn for each entry of @sub ("." and ".." skipped) until it returns
 * non-zero.  0, or -errno when @sub cannot be read (-EACCES: not ours to read).
 */
typedef int (*registry_visit_fn)(int dirfd, const char *sub, const char *name, void *arg);
int registry_for_each(int dirfd, const char *sub, registry_visit_fn fn, void *arg);

/* Remove entries of dead owners and stale rendezvous sockets. */
void registry_gc(int dirfd);

/*
 * The registry this process uses: opened by registry_attach (at start,
 * runtime/init.c), kept by @keep as one of the library's own descriptors
 * (fd_hide: out of the program's way).  -1 until then, and for good when it
 * could not be opened (the message is in @err).
 */
extern int registry_fd;
int registry_attach(const char *dir, int is_default, int (*keep)(int fd), char *err,
                    size_t errlen);
/* Closed again (a start that failed after registry_attach). */
void registry_detach(void);

/* The registry's lookup lock, held across fork() (runtime/fork.c lists the order). */
void registry_fork_lock(void);
void registry_fork_unlock(void);

#endif
