/*
 * deferred.h - work that need not delay the application, done while one of
 * its threads would otherwise spin waiting for a peer.
 *
 * Closing a socket costs the kernel 5-10 us (more for a TCP socket whose
 * reset it delivers to the peer on the spot).  The hidden TCP socket of a
 * connection that was carried by shared memory has nothing left to say when
 * the connection closes, so its close can wait for a moment when the thread
 * has nothing better to do: the spin at the start of its next wait.  A
 * connection-per-request client then pays for it in time it would have
 * spent spinning, not on the way to its next connect().
 */
#ifndef SMCLO_DEFERRED_H
#define SMCLO_DEFERRED_H

/* Close @fd (a descriptor of ours the application never sees) later. */
void deferred_close(int fd);

/* Do what was deferred; called where a thread is about to spin.  Returns
 * how many descriptors it closed. */
int deferred_run(void);

/* In a forked child: close the inherited copies now, the parent owns them. */
void deferred_after_fork(void);

#endif
