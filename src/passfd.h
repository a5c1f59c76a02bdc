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

/* recvmsg() brought descriptors in: take over the connections among them. */
void passfd_received(const struct msghdr *m);

#endif
