/*
 * epoll_early.h - epoll registrations made before connect(), moved across
 * the switch (epoll_early.c has the argument).
 */
#ifndef SMCLO_EPOLL_EARLY_H
#define SMCLO_EPOLL_EARLY_H

#include <sys/epoll.h>

/* After a successful epoll_ctl(@epfd, @op, @fd, @ev) on a TCP socket not yet connected. */
void epoll_early_ctl(int epfd, int op, int fd, const struct epoll_event *ev);
/* @fd (a socket, or an epoll set) is being closed: forget its registrations. */
void epoll_early_fd_closed(int fd);
/* A new set got number @epfd: whatever had it before was closed unseen. */
void epoll_early_epoll_created(int epfd);
/*
 * Whether @fd names a set a copy was kept of: a close of it must reach
 * epoll_early_fd_closed even where the number carries no FDF_EPOLL (a dup
 * of a set, one inherited across exec).
 */
int epoll_early_names_set(int fd);
/* Socket @fd was left on TCP at its connect(): no switch will move its
 * registrations, whose records go. */
void epoll_early_forget(int fd);
/*
 * io_hooks swap_begin/swap_end: around the handshake's dup3 of the doorbell
 * socket over @fd, take @fd's recorded registrations out of their sets while
 * it still names the TCP socket, then make them again on what it names now.
 */
void epoll_early_swap_begin(int fd);
void epoll_early_swap_end(int fd);
/*
 * io_hooks bell_watch/bell_unwatch: every set holding @fd (a pending
 * connection whose first bytes went over TCP) watches its doorbell @bell
 * too, for what @fd's registration reads, with @fd's data; and stops.
 */
int epoll_early_bell_watch(int fd, int bell);
void epoll_early_bell_unwatch(int fd);
/* After a wait returned @n events at @ev: a watched doorbell's become the
 * program's (EPOLLIN, its data), merged with the TCP socket's event of the
 * same registration.  Returns the count left. */
int epoll_early_after_wait(struct epoll_event *ev, int n);
/* Before a wait on @epfd: decide the pending connections registered in it
 * early (not those whose doorbell it watches). */
void epoll_early_before_wait(int epfd);
/* Around fork() (runtime/fork.c): first of the shim's locks, before epoll_watch's. */
void epoll_early_fork_lock(void);
void epoll_early_fork_unlock(void);

#endif
