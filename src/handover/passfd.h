/*
 * passfd.h - accelerated descriptors passed with SCM_RIGHTS (passfd.c).
 */
#ifndef SMCLO_PASSFD_H
#define SMCLO_PASSFD_H

#include <sys/socket.h>
#include <sys/types.h>

/*
 * sendmsg() of a message that passes descriptors: for each accelerated
 * connection among them, a parcel the receiver's smclo takes over, or, for
 * a receiver without smclo, a reset socket in its place.
 */
ssize_t passfd_sendmsg(int sock, const struct msghdr *m, int flags,
                       ssize_t (*real)(int, const struct msghdr *, int));

/*
 * recvmsg() into a control buffer large enough for the descriptors a sender
 * appends: take over the connections passed, and give the application
 * what it would have had (its descriptors, truncated as the kernel would).
 */
ssize_t passfd_recvmsg(int sock, struct msghdr *m, int flags,
                       ssize_t (*real)(int, struct msghdr *, int));

/* In a fork child (runtime/fork.c): no parcel of its own, the lock free. */
void passfd_fork_child(void);

#endif
