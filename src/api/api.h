/*
 * api.h - what the native API's files (api.c: claims and peeks, pool.c:
 * buffer pools) share: finding the connection behind a descriptor, telling
 * whether a descriptor still names it, and sending a buffer whole.
 */
#ifndef SMCLO_API_H
#define SMCLO_API_H

/* What the native API exports (include/smclo.h); everything else is hidden. */
#define EXPORT __attribute__((visibility("default")))

#include "conn.h"

#include <sys/types.h>

/* errno := @err; -1. */
int api_fail(int err);
/*
 * The accelerated connection behind @fd, referenced, with its handshake
 * decided; NULL with *@err 0 for a TCP socket the copy path can serve, or
 * with *@err set for one it cannot (ENOTSOCK, EBADF, EOPNOTSUPP, ENOTCONN,
 * EPIPE).
 */
struct conn *api_conn(int fd, int for_send, int *err);
/* Does @fd still name @c (or, for the TCP path, @c NULL, the file @dev/@ino)? */
int api_names(int fd, const struct conn *c, dev_t dev, ino_t ino);
/*
 * Send @n bytes on the TCP socket @fd as a send() of them would: all of
 * them, waiting for room - but on a non-blocking socket, when SO_SNDTIMEO
 * expires, or when a signal without SA_RESTART comes, the count sent so far
 * (or -EAGAIN / -EINTR if none).  @flags are send()'s besides MSG_NOSIGNAL;
 * *@calls (if not NULL) counts the send() calls that took bytes (each is
 * one MSG_ZEROCOPY notification).  Returns the count or -errno.
 */
ssize_t api_send_all(int fd, const void *buf, size_t n, int flags, unsigned *calls);
/*
 * The same with @once(@ctx, ...) as the send() call: it returns the count
 * it sent, or -1 with errno (EAGAIN when the socket has no room: it is
 * polled for room before the next call - what makes the socket report an
 * error without room, such as MSG_ZEROCOPY's notifications, @once takes
 * away before it says EAGAIN, or the poll would not wait).
 */
typedef ssize_t (*api_send_once_fn)(void *ctx, int fd, const void *buf, size_t n);
ssize_t api_send_all_by(int fd, const void *buf, size_t n, api_send_once_fn once, void *ctx,
                        unsigned *calls);

#endif
