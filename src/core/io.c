/*
 * io.c - the hooks the data path calls the layers above it through
 * (io_hooks, io.h), and what a claim or peek records as its holder.
 *
 * Two implementations: the library's, which runtime/init.c registers once at
 * start (the descriptor table keeps smclo's descriptors out of the program's
 * way, the epoll layer hears of a thread about to sleep), and the core's
 * own below, for a core without a front end above it (the unit tests, the
 * fuzzers, a process where the library did not start): descriptors kept
 * where they are, no timeouts, nobody to tell.
 */
#include "io.h"

#include <fcntl.h>

static void io_default_thread_sleeps(void)
{
}

static int io_default_rcvtimeo_ms(struct conn *c, int fd)
{
	return 0;
}

static int io_default_keep_fd(int fd)
{
	return fd;
}

static int io_default_keep_copy(int fd, int if_spare)
{
	return if_spare ? -1 : sys_fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

static int io_default_is_kept(int fd)
{
	return fd >= 0;
}

static void io_default_swap(int fd)
{
}

static int io_default_bell_watch(int fd, int bell)
{
	return -1;
}

static const struct io_hooks io_default_hooks = {
	.thread_sleeps = io_default_thread_sleeps,
	.rcvtimeo_ms = io_default_rcvtimeo_ms,
	.keep_fd = io_default_keep_fd,
	.keep_copy = io_default_keep_copy,
	.is_kept = io_default_is_kept,
	.swap_begin = io_default_swap,
	.swap_end = io_default_swap,
	.bell_watch = io_default_bell_watch,
	.bell_unwatch = io_default_swap,
};

static const struct io_hooks *io_ops = &io_default_hooks;

void io_set_hooks(const struct io_hooks *h)
{
	io_ops = h;
}

void io_thread_sleeps(void)
{
	io_ops->thread_sleeps();
}

int io_keep_fd(int fd)
{
	return io_ops->keep_fd(fd);
}

int io_keep_copy(int fd, int if_spare)
{
	return io_ops->keep_copy(fd, if_spare);
}

void io_swap_begin(int fd)
{
	io_ops->swap_begin(fd);
}

void io_swap_end(int fd)
{
	io_ops->swap_end(fd);
}

int io_bell_watch(int fd, int bell)
{
	return io_ops->bell_watch(fd, bell);
}

void io_bell_unwatch(int fd)
{
	io_ops->bell_unwatch(fd);
}

int io_is_kept(int fd)
{
	return io_ops->is_kept(fd);
}

int io_rcvtimeo_ms(struct conn *c, int fd)
{
	return io_ops->rcvtimeo_ms(c, fd);
}

/* What a claim or peek records as its holder (io_hold_take, io.h). */
_Thread_local char io_thread_token;
