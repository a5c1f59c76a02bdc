/*
 * peerid.h - whom a region of ours goes to: identities of peer processes
 * that hold across PID namespaces and are never reused, for region reuse
 * (region.h).
 *
 * A client hands a region again only to the process it went to before.  A
 * pid cannot say which process that is: a peer in another PID namespace
 * (every container) reads as pid 0 in SO_PEERCRED, a pid written into the
 * registry is a number of the writer's namespace (two containers both have
 * a pid 1), and pids are reused.  So a region is keyed by one of:
 *
 *  - PEERID_PIDFS: the inode of the peer's pidfd (SO_PEERPIDFD, Linux 6.5)
 *    on pidfs (6.9): the kernel gives every process one from a 64-bit
 *    counter that never goes back while the machine is up, and it is the
 *    same seen from any namespace.  Used where the kernel names the peer
 *    process: the socket pair a server made (the rendezvous handshake).
 *  - PEERID_LINK: the link an offer goes through (inbox.c), numbered by
 *    this process.  A connected datagram socket delivers only to the one
 *    socket it was connected to (never to another bound in its place
 *    later), and an inbox is read only by the process that bound it.
 *    Used where the client cannot learn who will receive (inbox and
 *    direct handshakes: a datagram socket has no peer credentials).
 *  - PEERID_PID: SO_PEERCRED's pid, where pidfs is missing (kernels before
 *    6.9): a peer we cannot see (pid 0) gets no key, so no reuse.
 *
 * PEERID_NONE (0) is nobody: a region made for it is never handed again.
 * Keys of different kinds never compare equal (the kind is in the top bits).
 */
#ifndef SMCLO_PEERID_H
#define SMCLO_PEERID_H

#include <stdint.h>
#include <sys/types.h>

typedef uint64_t peerid;

#define PEERID_NONE 0
enum peerid_kind { PEERID_PID = 1, PEERID_PIDFS = 2, PEERID_LINK = 3 };

#define PEERID_KIND_SHIFT 62
#define PEERID_VALUE_MASK ((UINT64_C(1) << PEERID_KIND_SHIFT) - 1)

/*
 * Inline: region.c uses only these, and links without peerid.c (the fuzzing
 * harness of region_map builds region.c alone).
 */

/* A key of @kind for @value; PEERID_NONE if @value is 0 or does not fit. */
static inline peerid peerid_make(enum peerid_kind kind, uint64_t value)
{
	if (value == 0 || (value & ~PEERID_VALUE_MASK))
		return PEERID_NONE;
	return (uint64_t)kind << PEERID_KIND_SHIFT | value;
}

static inline enum peerid_kind peerid_kind_of(peerid k)
{
	return (enum peerid_kind)(k >> PEERID_KIND_SHIFT);
}

/* The pid a PEERID_PID key names (for liveness checks), else 0. */
static inline pid_t peerid_pid(peerid k)
{
	return peerid_kind_of(k) == PEERID_PID ? (pid_t)(k & PEERID_VALUE_MASK) : 0;
}

/*
 * The process that made socket pair @s (or connected it): its pidfs key,
 * or where pidfs is missing a PEERID_PID key of @pid (SO_PEERCRED's, 0 if
 * the peer is in a PID namespace we cannot see: PEERID_NONE).
 */
peerid peerid_of_socket(int s, pid_t pid);

#endif
