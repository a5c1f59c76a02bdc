/*
 * sys.h - direct system calls for the library's own use.
 *
 * The library interposes close, read, send and friends; when it needs the
 * kernel's behaviour for its own descriptors it calls the kernel directly, so
 * it never recurses into its own wrappers and never depends on the order in
 * which the dynamic linker resolved them.
 */
#ifndef SMCLO_SYS_H
#define SMCLO_SYS_H

#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int sys_close(int fd)
{
	return (int)syscall(SYS_close, fd);
}

/* A raw call's result in the library's own convention: the value, or -errno. */
static inline long sys_result(long r)
{
	return r < 0 ? -errno : r;
}

static inline ssize_t sys_read(int fd, void *b, size_t n)
{
	return (ssize_t)syscall(SYS_read, fd, b, n);
}

static inline ssize_t sys_write(int fd, const void *b, size_t n)
{
	return (ssize_t)syscall(SYS_write, fd, b, n);
}

/* open(O_RDONLY) without libc, to pair with sys_close: a sanitizer that
 * sees one of the two and not the other takes the number's reuse for a race */
static inline int sys_open_read(const char *path)
{
	return (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
}

static inline int sys_ioctl_int(int fd, unsigned long req, int *v)
{
	return (int)syscall(SYS_ioctl, fd, req, v);
}

static inline int sys_ioctl(int fd, unsigned long req, void *arg)
{
	return (int)syscall(SYS_ioctl, fd, req, arg);
}

static inline ssize_t sys_recv(int fd, void *b, size_t n, int f)
{
	return (ssize_t)syscall(SYS_recvfrom, fd, b, n, f, NULL, NULL);
}

static inline ssize_t sys_send(int fd, const void *b, size_t n, int f)
{
	return (ssize_t)syscall(SYS_sendto, fd, b, n, f, NULL, 0);
}

static inline ssize_t sys_sendmsg(int fd, const struct msghdr *m, int f)
{
	return (ssize_t)syscall(SYS_sendmsg, fd, m, f);
}

static inline ssize_t sys_recvmsg(int fd, struct msghdr *m, int f)
{
	return (ssize_t)syscall(SYS_recvmsg, fd, m, f);
}

static inline int sys_poll(struct pollfd *p, nfds_t n, int t)
{
	return (int)syscall(SYS_poll, p, n, t);
}

static inline int sys_socket(int d, int t, int p)
{
	return (int)syscall(SYS_socket, d, t, p);
}

static inline int sys_connect(int fd, const void *a, socklen_t l)
{
	return (int)syscall(SYS_connect, fd, a, l);
}

static inline int sys_bind(int fd, const void *a, socklen_t l)
{
	return (int)syscall(SYS_bind, fd, a, l);
}

static inline int sys_listen(int fd, int n)
{
	return (int)syscall(SYS_listen, fd, n);
}

static inline int sys_accept4(int fd, void *a, socklen_t *l, int f)
{
	return (int)syscall(SYS_accept4, fd, a, l, f);
}

static inline int sys_socketpair(int domain, int type, int proto, int sv[2])
{
	return (int)syscall(SYS_socketpair, domain, type, proto, sv);
}

static inline int sys_shutdown(int fd, int h)
{
	return (int)syscall(SYS_shutdown, fd, h);
}

static inline int sys_getsockname(int fd, void *a, socklen_t *l)
{
	return (int)syscall(SYS_getsockname, fd, a, l);
}

static inline int sys_getpeername(int fd, void *a, socklen_t *l)
{
	return (int)syscall(SYS_getpeername, fd, a, l);
}

static inline int sys_getsockopt(int fd, int l, int o, void *v, socklen_t *n)
{
	return (int)syscall(SYS_getsockopt, fd, l, o, v, n);
}

static inline int sys_setsockopt(int fd, int l, int o, const void *v, socklen_t n)
{
	return (int)syscall(SYS_setsockopt, fd, l, o, v, n);
}

static inline int sys_dup3(int a, int b, int f)
{
	return (int)syscall(SYS_dup3, a, b, f);
}

static inline int sys_fcntl(int fd, int c, long a)
{
	return (int)syscall(SYS_fcntl, fd, c, a);
}

/* epoll_wait without sleeping (epoll_pwait: every architecture has it). */
static inline int sys_epoll_look(int epfd, void *ev, int max)
{
	return (int)syscall(SYS_epoll_pwait, epfd, ev, max, 0, NULL, 8);
}

static inline int sys_ppoll(struct pollfd *p, nfds_t n, struct timespec *ts, const void *mask)
{
	return (int)syscall(SYS_ppoll, p, n, ts, mask, 8);
}

static inline int sys_epoll_ctl(int epfd, int op, int fd, void *ev)
{
	return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

/*
 * getpid() is a system call and the answer only changes in a fork child,
 * which calls sys_pid_forget() from its atfork handler.
 */
extern pid_t sys_pid_cached;

static inline pid_t sys_getpid(void)
{
	if (!sys_pid_cached)
		sys_pid_cached = (pid_t)syscall(SYS_getpid);
	return sys_pid_cached;
}

static inline void sys_pid_forget(void)
{
	sys_pid_cached = 0;
}

/*
 * A vfork child (Python's subprocess, hand-written vfork + exec) runs in
 * its parent's memory, with a pid of its own and no atfork handler: what it
 * changes in our tables, it changes for the parent.  A system call, so
 * asked only where a descriptor we know is involved.
 */
static inline int sys_in_vfork_child(void)
{
	return (pid_t)syscall(SYS_getpid) != sys_getpid();
}

/* futex on a word shared between processes (no FUTEX_PRIVATE_FLAG) */
static inline int sys_futex_wait(_Atomic uint32_t *w, uint32_t val, const struct timespec *t)
{
	return (int)syscall(SYS_futex, w, 0 /* FUTEX_WAIT */, val, t, NULL, 0);
}

static inline void sys_futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, w, 1 /* FUTEX_WAKE */, 0x7fffffff, NULL, NULL, 0);
}

/* Nanoseconds and milliseconds on the monotonic clock (a vDSO call, no system call). */
static inline long long mono_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline long mono_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static inline void sys_close_all(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			sys_close(fds[i]);
}

#endif
