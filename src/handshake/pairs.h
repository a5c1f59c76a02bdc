/*
 * pairs.h - the socket pairs of the inbox handshake, made ahead.
 *
 * An inbox offer carries one end of a fresh AF_UNIX SOCK_SEQPACKET pair
 * (design.md §2a).  Making one (socketpair, the doorbell send buffer,
 * moving our end up among the hidden descriptors) costs the client 6-8 µs
 * on its way to the SYN; a client that spins while it waits for an answer
 * has that time to spare.  So a process that makes offers keeps a couple
 * made ahead, refilled from spin.c, one per spin, only where spinning pays
 * (never on a busy machine, where the time is not spare).
 *
 * A pair made ahead is fresh: no byte, no epoll registration, never handed
 * to anyone.  Both ends wait among the hidden descriptors (close-on-exec);
 * where there is no room up there (a small descriptor limit) none waits,
 * since it would hold numbers that are the application's.
 * Before fork the ready ones are closed, so a parent and its child never
 * offer the same pair, and a pair made under another effective uid is not
 * used (the server reads the maker's uid from it: SO_PEERCRED).
 */
#ifndef SMCLO_PAIRS_H
#define SMCLO_PAIRS_H

/*
 * A pair for an offer: @pair[0] is ours, hidden, its send buffer sized for
 * doorbells (SIDE_SNDBUF); @pair[1] is the end to send.  1 if it was made
 * ahead (then @pair[1] is hidden and ours too), 0 if made now (@pair[1] is
 * where socketpair() put it), or -1 with errno.
 */
int pairs_take(int pair[2]);

/* Make one pair ahead if this process makes offers and has fewer than it
 * keeps; 1 if it did (called where a thread is about to spin). */
int pairs_refill(void);

/* Close the ready ones (before fork). */
void pairs_drop(void);
/* In a fork child: close the copies of any made while the parent forked. */
void pairs_after_fork(void);

#endif
