/*
 * handover.h - what an exec does to the accelerated connections a program
 * passes on (inetd, systemd Accept=yes, sshd's re-exec, a shell pipeline).
 *
 * A descriptor of an accelerated connection is one end of a socket pair;
 * a program without smclo would read its doorbells as end-of-file and lose
 * the stream without a word.  So every libc entry that starts a program
 * (exec.c) asks here first:
 *  - if the new program will load smclo (LD_PRELOAD names this library, the
 *    executable is dynamic and not set-ID), the connection is handed over:
 *    the descriptors of its state (the connection-state chunk, the region,
 *    the hidden TCP socket) stay open across the exec and a record of each
 *    connection, keyed by the doorbell socket's inode, travels in the
 *    environment (SMCLO_HANDOVER); the new program takes them over at load
 *    and goes on, accelerated, with no byte lost;
 *  - otherwise the connection goes on over TCP and the new program gets
 *    the TCP socket, what the ring held unread sent again by the peer
 *    (hs_hand_on_tcp: a move, counted `handed-on`);
 *  - failing that, every descriptor of it the new program would get is
 *    replaced by a fresh, unconnected TCP socket (reads fail with ENOTCONN,
 *    writes with EPIPE: a reset, never a silent end of file), and the
 *    reset is counted (`exec-no-smclo`).
 * The inode, not the descriptor number, names the connection: a vfork or
 * posix_spawn child moves descriptors (dup2 onto 0 and 1) where this
 * process's table cannot see.
 */
#ifndef SMCLO_HANDOVER_H
#define SMCLO_HANDOVER_H

#include <stddef.h>

#define HANDOVER_MAX 64                 /* connections one exec hands over */
#define HANDOVER_ENV "SMCLO_HANDOVER"

/*
 * What a handover changed, to take back if the exec fails.  Lives on the
 * exec caller's stack: a vfork child must not allocate.
 */
struct handover_undo {
	int cloexec_cleared[3 * HANDOVER_MAX];
	int n_cleared;
	struct conn_shared *counted[HANDOVER_MAX];   /* a holder more, for a vfork child */
	int n_counted;
	struct conn_shared *left[HANDOVER_MAX];      /* a holder less: closes at the exec */
	int n_left;
};

/* Room for the environment entry of HANDOVER_MAX records. */
#define HANDOVER_ENV_MAX (sizeof(HANDOVER_ENV) + 1 + HANDOVER_MAX * 200)

/*
 * Will @path (an executable; NULL: not found) load this library when
 * executed with @envp?  1 yes, 0 no, -1 the kernel will refuse to execute
 * it at all (missing, not a regular file, not executable): then an exec
 * must change nothing, as a caller trying one PATH entry after another
 * goes on with its connections.
 */
int handover_target_loads_smclo(const char *path, char *const envp[]);

/*
 * In a process (or vfork child) about to exec with @envp: hand over or
 * reset every accelerated connection among its inheritable descriptors.
 * Writes the new environment into @out (room for @cap pointers; entries
 * point into @envp and @buf) and returns it, or @envp itself when nothing
 * is handed over.
 */
char *const *handover_exec(char *const envp[], int loads_smclo, char **out, size_t cap,
                           char *buf, size_t buflen, struct handover_undo *undo);

/* The exec failed: take back what the handover changed. */
void handover_undo(struct handover_undo *undo);

/* At load: take over the connections the previous program handed over. */
void handover_adopt(void);

struct conn;
/* The descriptors a connection's record names (-1: none goes along). */
struct handover_fds {
	int sh;                 /* the state chunk (conn_shared) */
	int region;             /* the rings */
	int tcp;                /* the TCP socket under it */
	int pool, pool_wake;    /* the peer's buffer pool and its wake-up socket */
};
/*
 * The record of @c naming @fds, its state at offset @off of theirs
 * (passfd.c writes one for a descriptor passed with SCM_RIGHTS); its
 * length, or -1 if @len is short.
 */
int handover_format(char *buf, size_t len, const struct conn *c, unsigned off,
                    const struct handover_fds *fds);
/*
 * Take over the connection of one record, whose descriptors are @fds here
 * (the record's own numbers are ignored), on every descriptor of this
 * process with its doorbell socket.  0 if taken over; the caller closes
 * the descriptors of @fds either way.
 */
int handover_take(const char *record, const struct handover_fds *fds);

#endif
