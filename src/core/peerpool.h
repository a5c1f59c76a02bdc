/*
 * peerpool.h - the peer's buffer pool as the receiving side holds it.
 *
 * A sender that sends from a pool (pool.c, the native API) hands its pool's
 * memfd and one end of a socket pair to us with one doorbell (bell_drain
 * takes them).
 * Once we mapped the pool, read-only, our ring header says so (pool_ack)
 * and the peer may put references into its stream (ring.h, rx.c reads
 * them); every reference we finish consuming releases its buffer, and the
 * socket tells the sender to look.
 */
#ifndef SMCLO_PEERPOOL_H
#define SMCLO_PEERPOOL_H

#include "conn.h"

/*
 * The peer handed over @memfd and @wakefd (either may be -1: what the
 * message carried).  Both are ours now: kept if they are what a pool needs,
 * else closed, and the peer gets no acknowledgement.
 */
void peerpool_adopt(struct conn *c, int memfd, int wakefd);
/*
 * The pool of a connection taken over from the program that exec'd us or
 * passed it to us (handover.c), which had it from the peer: @memfd and
 * @wakefd checked as peerpool_adopt checks them, mapped, and copies of
 * them kept (the caller closes its own).  0, or -1: the connection then
 * has no pool, and a reference into it resets the connection.
 */
int peerpool_inherit(struct conn *c, int memfd, int wakefd);
/* We consumed a reference: the sender may reuse its buffer. */
void peerpool_released(struct conn *c);
/* The connection object goes: unmap the pool, close the wake-up socket. */
void peerpool_drop(struct conn *c);

#endif
