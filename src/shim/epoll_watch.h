/*
 * epoll_watch.h - epoll waits that look at the rings (epoll_watch.c has the
 * argument).
 *
 * The epoll wrappers in epoll.c call these; everything else about a
 * descriptor's readiness stays the kernel's.
 */
#ifndef SMCLO_WATCH_H
#define SMCLO_WATCH_H

#include <sys/epoll.h>

#define WATCH_PASS  (-2)    /* not ours: do the real wait */
#define WATCH_SLEEP (-3)    /* nothing yet: do the real wait, then epoll_watch_after_sleep() */

/* A new epoll instance @epfd (from epoll_create*). */
void epoll_watch_epoll_created(int epfd);

/*
 * Before epoll_ctl(@epfd, @op, @fd, @ev): a DEL of an accelerated descriptor
 * parks its registration, an ADD of a parked one takes it back (epoll_watch.c).
 * Returns the call's result (0, or -1 with errno) when it was done here, or
 * WATCH_PASS: make the real call, then epoll_watch_ctl().
 */
int epoll_watch_ctl_parked(int epfd, int op, int fd, struct epoll_event *ev);

/* After a successful epoll_ctl(@epfd, @op, @fd, @ev). */
void epoll_watch_ctl(int epfd, int op, int fd, const struct epoll_event *ev);

/*
 * Drop the events of parked registrations from the @n a wait returned (for
 * the waits on sets epoll_watch.c does not follow); returns how many are left.
 */
int epoll_watch_drop_parked(struct epoll_event *ev, int n);

/* @fd is being closed (or replaced by dup2): forget what we know of it. */
void epoll_watch_fd_closed(int fd);

/* @epfd was duplicated: waits through the copy are not ours, so stop watching. */
void epoll_watch_epfd_copied(int epfd);

/*
 * @epfd is being waited for by poll or select: it is nested from now on.
 * Returns 1 if it has events only we know about (it is readable).
 */
int epoll_watch_epfd_polled(int epfd);

/*
 * Before an epoll wait on @epfd: the events only we know about (bytes that
 * came without a doorbell) merged with what the kernel has ready now; when
 * there are none and @timeout (ms, -1 forever) allows, watch the rings for a
 * moment (@may_spin: the wait has no signal mask of its own).  Returns the
 * number of events to return (0 only for @timeout 0), WATCH_PASS or
 * WATCH_SLEEP.
 */
int epoll_watch_before_wait(int epfd, struct epoll_event *ev, int max, int timeout, int may_spin);

/*
 * After the real wait that WATCH_SLEEP asked for returned @n events in @ev:
 * drops the stale doorbells among them and returns how many are left (0
 * means: wait again), or @n itself when it is not positive.
 */
int epoll_watch_after_sleep(int epfd, struct epoll_event *ev, int n);

/* The calling thread is about to sleep in the kernel: end the watches it started. */
void epoll_watch_thread_sleeps(void);

/* Around the switch of @fd to its TCP socket after a move (handshake/moved.c):
 * its registrations follow it (io_hooks swap_begin/_end). */
void epoll_watch_swap_begin(int fd);
void epoll_watch_swap_end(int fd);

/* Before exec: end every watch (the new program knows nothing of them). */
void epoll_watch_before_exec(void);

/*
 * Around fork() (runtime/fork.c): prepare takes the table of sets and stops
 * watching every ring - before the lower layers' locks, which what it calls
 * (conn_put) may take; parent lets go; the child, the only thread left,
 * makes every lock new.
 */
void epoll_watch_fork_prepare(void);
void epoll_watch_fork_parent(void);
void epoll_watch_fork_child(void);

#endif
