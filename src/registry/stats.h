/*
 * stats.h - what `smclo stat` and `smclo stats` read.
 *
 * Each process publishes its connections in a table file c/<pid>.<rand>
 * (one slot per connection, written with plain stores on the data path: no
 * system call, no shared cache line with other processes).  Totals live in
 * the registry's `stats` file and are updated with atomic adds when a
 * connection is decided and when it ends.  A table whose owner died is folded
 * into the totals by whoever notices first (it renames the table away first,
 * so it is folded once).
 */
#ifndef SMCLO_STATS_H
#define SMCLO_STATS_H

#include "addr.h"
#include "reason.h"

#include <stdatomic.h>
#include <stdint.h>

#define STATS_MAGIC   0x54534d53u
#define TABLE_MAGIC   0x42544d53u
#define TABLE_SLOTS   4096
#define STATS_VERSION 3
#define STATS_REASONS 32    /* room for new reasons without moving the fields after */

enum conn_mode { MODE_PENDING = 0, MODE_SHM = 1, MODE_TCP = 2 };
enum conn_role { ROLE_CLIENT = 1, ROLE_SERVER = 2 };

struct stat_slot {
	_Atomic uint32_t in_use;
	int32_t pid;
	int32_t fd;
	uint8_t mode, role;
	uint16_t reason;
	struct ep local, peer;
	uint32_t tx_ring, rx_ring;
	_Atomic uint64_t tx_bytes, rx_bytes;
	_Atomic uint32_t tx_fill, rx_fill;
	_Atomic uint64_t bells_sent, bells_skipped;   /* doorbells rung / not needed */
	uint64_t started;
};

struct stat_table {
	uint32_t magic;
	int32_t pid;
	uint32_t nslots;
	uint32_t pad;
	struct stat_slot slots[TABLE_SLOTS];
};

struct stats_totals {
	uint32_t magic;
	uint32_t version;
	int64_t created;
	_Atomic int64_t reset;
	_Atomic uint64_t accelerated[3];      /* by role: [1] client, [2] server */
	_Atomic uint64_t fallback[STATS_REASONS];
	_Atomic uint64_t handshake_errors;
	_Atomic uint64_t tx_bytes, rx_bytes;
	_Atomic uint64_t conns_closed;
	/* connection regions (region.h): made new, or taken again from the pool */
	_Atomic uint64_t regions_created, regions_reused;
	/* doorbells of closed connections: rung, and skipped for a reader
	 * that was watching (spin_take, watchers) */
	_Atomic uint64_t bells_sent, bells_skipped;
	/* accelerated connections whose handshake was one offer to an inbox (inbox.h) */
	_Atomic uint64_t inbox_handshakes;
	/* servers: a client's region mapped anew, or found still mapped from
	 * an earlier connection with the same client */
	_Atomic uint64_t peer_regions_mapped, peer_regions_kept;
	/* servers: connections taken without TCP (direct.c) */
	_Atomic uint64_t direct_handshakes;
	/* buffer pools' sends (pool.c), by their notification: the peer read
	 * the buffer in place, the bytes were copied, the kernel's zero copy
	 * sent them, the peer went away first */
	_Atomic uint64_t pool_sends_by_reference, pool_sends_copied, pool_sends_kernel,
	                 pool_sends_reclaimed;
	/* accelerated connection ends that went on over TCP (core/move.c), by
	 * reason (appended: a file an older version made grows to take it) */
	_Atomic uint64_t moved[STATS_REASONS];
};

_Static_assert(R_COUNT <= STATS_REASONS, "stats_totals.fallback has no room for every reason");

/*
 * Map this user's totals file (t/<uid>), creating it if needed: each user
 * counts in a file of its own that nobody else may write, so that no other
 * user can truncate it under us (registry_open_mappable).  NULL on failure:
 * not safe to map, or laid out by another smclo version.
 */
struct stats_totals *stats_totals_map(int dirfd);
/* What stats_totals_map needs, for messages when it fails. */
#define STATS_TOTALS_RULE "a file of this user's that nobody else may write, " \
                          "laid out by this smclo version"
/* The totals of every user of the registry, added up (read, not mapped);
 * `reset` is the latest reset among them.  Returns how many files. */
int stats_totals_sum(int dirfd, struct stats_totals *out);

/* This process's table (created and locked on first use; NULL on failure). */
struct stat_table *stats_table(int dirfd, char *name_out, size_t len);
/* After fork: the child starts its own table next time. */
void stats_forget_table(void);
/* Before fork: the child will hold this process's table too. */
void stats_table_note_fork(void);
/*
 * At a normal exit: remove this process's table if nothing of it is left to
 * count (no open connection) and no fork child holds it; otherwise `smclo
 * stat`/`stats` fold it in once the process is gone.
 */
void stats_table_remove_at_exit(int dirfd);
/*
 * The layer above keeps the descriptors it marks as its own from the
 * program's close() loops (fdtab.c, fd_hide): the table's lock descriptor
 * goes through @keep, which returns the descriptor to hold from then on.
 */
void stats_set_fd_keeper(int (*keep)(int fd));

struct stat_slot *stats_slot_alloc(struct stat_table *t, int fd, int role);
void stats_slot_decide(struct stats_totals *tot, struct stat_slot *s, int mode, int reason);
void stats_slot_release(struct stats_totals *tot, struct stat_slot *s);

/* Fold tables of dead processes into @tot and remove them.  Tables of
 * other processes are read, never mapped (their owner may truncate them). */
void stats_collect_dead(int dirfd, struct stats_totals *tot);

/* Visit every live slot (for `smclo stat`). */
void stats_for_each(int dirfd, void (*fn)(const struct stat_slot *, void *), void *arg);

void stats_reset(struct stats_totals *tot);

/* Connection ends left on TCP, for every reason. */
uint64_t stats_fallbacks(const struct stats_totals *t);

/*
 * Connection ends left on TCP for a reason other than the short-lived
 * policy (payoff.h): the ends a benchmark of accelerated connections must
 * not have.  The server's end of a connection its client kept on TCP as
 * short-lived saw a plain client and counts as peer-no-smclo, so as many of
 * those are left out.
 */
uint64_t stats_fallback_not_short_lived(const struct stats_totals *t);

/*
 * This user's totals in the registry this process uses (registry_fd),
 * mapped by stats_attach_totals at start; NULL when they cannot be (the
 * reason goes to stderr: the process's connections are then not counted).
 */
extern struct stats_totals *totals;
void stats_attach_totals(const char *dir);
/* Unmapped again (a start that failed after stats_attach_totals). */
void stats_detach_totals(void);

/* The table lock of this process's connections, held across fork() (runtime/fork.c lists the order). */
void stats_fork_lock(void);
void stats_fork_unlock(void);

#endif
