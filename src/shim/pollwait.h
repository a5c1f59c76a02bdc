/*
 * pollwait.h - poll(), ppoll(), select() and pselect() on accelerated
 * connections (pollwait.c has the argument).
 */
#ifndef SMCLO_POLLWAIT_H
#define SMCLO_POLLWAIT_H

#include <poll.h>
#include <signal.h>
#include <sys/select.h>

/* Does any descriptor in @fds need us (an accelerated connection or an epoll set)? */
/* Under a seccomp filter: the rings' last bytes among @fds, and among
 * select()'s read set (pollwait.c). */
int pollwait_moved_rings(struct pollfd *fds, nfds_t n, int r);
int pollwait_moved_select(int nfds, const fd_set *asked, fd_set *rd, int r);
int pollwait_needed(const struct pollfd *fds, nfds_t n);

/* ppoll() with smclo's view added: @timeout in ms (-1: forever). */
int pollwait(struct pollfd *fds, nfds_t n, int timeout, const sigset_t *mask);

/* Does any descriptor in @rd (below @nfds) need us? */
int pollwait_select_needed(int nfds, const fd_set *rd);

/* pselect() on top of pollwait(). */
int pollwait_select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout,
                    const sigset_t *mask);

#endif
