/*
 * preload.c - the interposition layer: libc's socket calls, seen first.
 *
 * Loaded with LD_PRELOAD by `smclo run`.  Every wrapper starts with the
 * cheapest possible test (one load from the descriptor table) and hands
 * anything that is not an accelerated connection straight to libc, so plain
 * descriptors, files and pipes pay almost nothing.  The decisions themselves
 * live in src/handshake/; the byte moving in tx.c / rx.c.
 *
 * Readiness is the kernel's (the descriptor is a real socket); the epoll,
 * poll and select wrappers only add what the rings know about bytes that
 * came without a doorbell (watch.c, pollwait.c), take out stale doorbells,
 * and watch the rings for a moment before sleeping.
 */
#include "config.h"
#include "fdtab.h"
#include "fdview.h"
#include "conn.h"
#include "deferred.h"
#include "handover.h"
#include "handshake.h"
#include "interpose.h"
#include "io.h"
#include "log.h"
#include "pairs.h"
#include "passfd.h"
#include "pollwait.h"
#include "registry.h"
#include "sockopt.h"
#include "spin.h"
#include "stats.h"
#include "sys.h"
#include "watch.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <time.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/close_range.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <fcntl.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif


static unsigned fork_generation;

/*
 * The accelerated connection behind @fd, referenced; NULL for anything
 * else.  A receiving call passes what it would read (@n, @flags): a blocking
 * read of a pending connection waits for the answer, not just the decision
 * (hs_resolve).
 */
static struct conn *shm_conn_reading(int fd, size_t n, int flags)
{
	struct conn *c;

	if (!smclo_active || !fd_has_conn(fd))
		return NULL;
	c = conn_get(fd);
	if (c && atomic_load_explicit(&c->pending, memory_order_relaxed) != PENDING_NONE) {
		int blocking = !(flags & (MSG_DONTWAIT | MSG_PEEK)) && !atomic_load(&c->sh->nonblock);
		/* every call but a small write needs the decision */
		hs_resolve(fd, c, blocking ? n : 0);
	}
	if (c && c->mode != MODE_SHM) {
		conn_put(c);
		return NULL;
	}
	return c;
}

static struct conn *shm_conn(int fd)
{
	return shm_conn_reading(fd, 0, 0);
}

/* ---- process lifecycle -------------------------------------------------- */

/*
 * fork: the child becomes one more holder of every connection it inherits.
 * It is counted in the parent, before the fork.  Counted in the child, a
 * parent that closes its copy at once (socat fork, PostgreSQL, inetd,
 * ForkingTCPServer) could find itself the last holder before the child
 * counted, and close the connection under the child.  The counted
 * connections are kept (referenced) until the fork returns: a fork that
 * failed takes its counts back, a child that lost one to a racing close
 * gives its count back.
 */
static pthread_mutex_t fork_count_lock = PTHREAD_MUTEX_INITIALIZER;     /* two forking threads */
struct fork_counted {
	struct conn *c;         /* referenced until the fork returns */
	int holder;             /* counted as one more holder */
};
static struct fork_counted *fork_counted;
static int n_fork_counted, fork_counted_cap;
static __thread int in_fork_wrapper;

/*
 * The walk holds no reference and another thread may be closing @c: what
 * it reads before taking one is only a hint, the reference is taken from a
 * live connection only (a count taken from zero would bring a freed one
 * back, to be freed twice), and the test is made again under it.  A
 * reference taken for nothing is kept all the same when it is the last -
 * dropped here, with the fork guard's locks held, it would free the
 * connection under them.
 */
static void count_fork_holder(int fd, struct conn *c, void *arg)
{
	if (c->mode != MODE_SHM || c->fork_gen == fork_generation)
		return;
	if (n_fork_counted == fork_counted_cap) {
		int cap = fork_counted_cap ? 2 * fork_counted_cap : 64;
		struct fork_counted *a = realloc(fork_counted, (size_t)cap * sizeof(*a));
		if (!a)
			return;         /* the child counts it, as a connection made meanwhile */
		fork_counted = a;
		fork_counted_cap = cap;
	}
	if (!conn_try_ref(c))
		return;
	if (c->mode != MODE_SHM || c->fork_gen == fork_generation) {
		if (conn_put_unless_last(c))
			return;
		fork_counted[n_fork_counted++] = (struct fork_counted){ c, 0 };
		return;
	}
	c->fork_gen = fork_generation;
	atomic_fetch_add(&c->sh->holders, 1);
	fork_counted[n_fork_counted++] = (struct fork_counted){ c, 1 };
}

/* After the fork, in the parent (@failed: no child) or the child. */
static void fork_counts_settle(int failed, int in_child, int drop_refs)
{
	struct fork_counted *counted = fork_counted;
	int n = n_fork_counted;

	for (int i = 0; i < n; i++) {
		struct conn *c = counted[i].c;

		/* no child, or a thread closed every descriptor of it just before the fork */
		if (counted[i].holder && (failed || (in_child && c->fd_count == 0)))
			atomic_fetch_sub(&c->sh->holders, 1);
	}
	if (in_child) {
		/*
		 * The child keeps the references: the last one would free the
		 * object under locks the fork guard may still hold, and what it
		 * points at is the parent's anyway.
		 */
		n_fork_counted = 0;
		pthread_mutex_init(&fork_count_lock, NULL);
		return;
	}
	/* the references are dropped after the lock is: freeing takes the
	 * pool's lock, which a thread forking meanwhile holds (fork guard)
	 * while it waits for ours */
	fork_counted = NULL;
	n_fork_counted = fork_counted_cap = 0;
	pthread_mutex_unlock(&fork_count_lock);
	for (int i = 0; drop_refs && i < n; i++)
		conn_put(counted[i].c);
	free(counted);
}

/* A connection bound while the fork was on its way: counted by the child. */
static void child_counts_holder(int fd, struct conn *c, void *arg)
{
	c->inherited = 1;
	if (c->mode == MODE_SHM && c->fork_gen != fork_generation) {
		c->fork_gen = fork_generation;
		atomic_fetch_add(&c->sh->holders, 1);
	}
}

/* Parent and child never offer the same pair made ahead (pairs.h). */
static void before_fork(void)
{
	fd_options_shared = 1;
	if (!smclo_active)
		return;
	pairs_drop();
	stats_table_note_fork();
	pthread_mutex_lock(&fork_count_lock);
	fork_generation++;
	conn_for_each_fd(count_fork_holder, NULL);
}

static void after_fork_parent(void)
{
	/* a fork that did not come through ours (daemon(), forkpty()): the
	 * fork guard's locks may still be ours here, so the references stay */
	if (smclo_active && !in_fork_wrapper)
		fork_counts_settle(0, 0, 0);
}

static void after_fork_child(void)
{
	sys_pid_forget();
	(void)sys_getpid();     /* filled now: never left for a vfork child to fill */
	if (!smclo_active)
		return;
	in_fork_wrapper = 0;
	fork_counts_settle(0, 1, 0);
	pairs_after_fork();
	deferred_after_fork();
	stats_forget_table();
	conn_for_each_fd(child_counts_holder, NULL);
	hs_after_fork();
}

/*
 * A change of user after listen() (nginx's workers, most daemons): the
 * listeners say so in the registry while the process still may write it.
 */
EXPORT int setuid(uid_t uid)
{
	REAL(setuid);

	if (smclo_active)
		hs_user_changing(uid);
	return real_setuid(uid);
}

EXPORT int seteuid(uid_t euid)
{
	REAL(seteuid);

	if (smclo_active)
		hs_user_changing(euid);
	return real_seteuid(euid);
}

EXPORT int setreuid(uid_t ruid, uid_t euid)
{
	REAL(setreuid);

	if (smclo_active)
		hs_user_changing(euid);
	return real_setreuid(ruid, euid);
}

EXPORT int setresuid(uid_t ruid, uid_t euid, uid_t suid)
{
	REAL(setresuid);

	if (smclo_active)
		hs_user_changing(euid);
	return real_setresuid(ruid, euid, suid);
}

/* A program that lowers its descriptor limit (fdtab.h, fd_budget_small). */
EXPORT int setrlimit(__rlimit_resource_t res, const struct rlimit *rl)
{
	REAL(setrlimit);
	int rc = real_setrlimit(res, rl);

	if (rc == 0 && res == RLIMIT_NOFILE && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int setrlimit64(__rlimit_resource_t res, const struct rlimit64 *rl)
{
	REAL(setrlimit64);
	int rc = real_setrlimit64(res, rl);

	if (rc == 0 && res == RLIMIT_NOFILE && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int prlimit(pid_t pid, __rlimit_resource_t res, const struct rlimit *nl,
                   struct rlimit *ol)
{
	REAL(prlimit);
	int rc = real_prlimit(pid, res, nl, ol);

	if (rc == 0 && nl && res == RLIMIT_NOFILE && (pid == 0 || pid == sys_getpid()) && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int prlimit64(pid_t pid, __rlimit_resource_t res, const struct rlimit64 *nl,
                     struct rlimit64 *ol)
{
	REAL(prlimit64);
	int rc = real_prlimit64(pid, res, nl, ol);

	if (rc == 0 && nl && res == RLIMIT_NOFILE && (pid == 0 || pid == sys_getpid()) && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int chroot(const char *path)
{
	REAL(chroot);
	int rc = real_chroot(path);

	if (rc == 0 && smclo_active)
		hs_chrooted();
	return rc;
}

EXPORT pid_t fork(void)
{
	REAL(fork);
	pid_t pid;

	in_fork_wrapper = 1;
	pid = real_fork();
	if (pid != 0) {
		int e = errno;
		in_fork_wrapper = 0;
		if (smclo_active)
			fork_counts_settle(pid < 0, 0, 1);
		errno = e;
	}
	return pid;
}

/* A process that exits normally takes its connection table with it. */
__attribute__((destructor)) static void smclo_fini(void)
{
	if (smclo_active)
		stats_table_remove_at_exit(registry_fd);
}

/* What a spinning waiter does first (spin.h): closes put off, a pair made ahead. */
static int idle_work(void)
{
	return deferred_run() + pairs_refill();
}

__attribute__((constructor)) static void smclo_init(void)
{
	char err[300];

	if (config_load(&cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "smclo: %s; acceleration disabled for this process\n", err);
		return;
	}
	if (cfg.disabled)
		return;
	(void)sys_getpid();     /* cached by us, not by a vfork child (sys_in_vfork_child) */
	if (fdtab_init() < 0) {
		fprintf(stderr, "smclo: cannot allocate the descriptor table; acceleration disabled\n");
		return;
	}
	hs_set_fd_hooks(&(struct hs_fd_hooks){ .flags = fd_flags,
	                                       .set_flags = fd_set_flags,
	                                       .add_flags = fd_add_flags,
	                                       .bind_conn = conn_bind_fd,
	                                       .get_conn = conn_get,
	                                       .for_each_conn = conn_for_each_fd,
	                                       .epoll_early = fd_epoll_early_count,
	                                       .kernel_accepts = fd_kernel_accepts,
	                                       .set_listen_lock = fd_set_listen_lock,
	                                       .take_listen_lock = fd_take_listen_lock,
	                                       .for_each_listener = fd_for_each_listener,
	                                       .release_kept = fd_forget_ours,
	                                       .budget_small = fd_budget_is_small,
	                                       .copy_timeouts = so_copy_timeouts,
	                                       .may_have_timeouts = so_may_have_timeouts });
	registry_fd = registry_open(cfg.dir, cfg.dir_is_default, err, sizeof(err));
	if (registry_fd < 0) {
		fprintf(stderr, "smclo: %s; acceleration disabled for this process\n", err);
		handover_adopt();       /* connections handed to us are reset, not misread */
		return;
	}
	registry_fd = fd_hide(registry_fd);
	totals = stats_totals_map(registry_fd);
	if (!totals && (errno == EPERM || errno == EPROTO))
		fprintf(stderr, "smclo: registry %s: t/%u must be " STATS_TOTALS_RULE "; this "
		        "process's connections are not counted in `smclo stats`\n",
		        cfg.dir, (unsigned)geteuid());
	else if (!totals)
		fprintf(stderr, "smclo: registry %s: cannot map t/%u: %s; this process's "
		        "connections are not counted in `smclo stats`\n",
		        cfg.dir, (unsigned)geteuid(), strerror(errno));
	pthread_atfork(before_fork, after_fork_parent, after_fork_child);
	spin_set_idle_work(idle_work);
	stats_set_fd_keeper(fd_hide);
	io_set_hooks(&(struct io_hooks){ .thread_sleeps = watch_thread_sleeps,
	                                 .rcvtimeo_ms = so_rcvtimeo_ms,
	                                 .keep_fd = fd_hide,
	                                 .keep_copy = fd_keep_copy,
	                                 .is_kept = fd_is_hidden });
	smclo_active = 1;
	DBG("active, registry %s, ring %u, handshake %d ms", cfg.dir, cfg.tx_size, cfg.handshake_ms);
	handover_adopt();
}

/* ---- creating, connecting, accepting ------------------------------------ */

EXPORT int socket(int domain, int type, int protocol)
{
	REAL(socket);
	int smc = 0, fd;

	if (smclo_active && domain == AF_SMC && (type & 0xf) == SOCK_STREAM) {
		/* smc_run-style programs: SMCPROTO_SMC6 (1) means IPv6 */
		domain = protocol == 1 ? AF_INET6 : AF_INET;
		protocol = 0;
		smc = 1;
	}
	fd = real_socket(domain, type, protocol);
	if (fd < 0 || !smclo_active)
		return fd;
	if (fd_has_conn(fd))
		conn_close_fd(fd);      /* closed behind our back (close_range, exec) */
	if ((domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
	    (protocol == 0 || protocol == IPPROTO_TCP))
		fd_set_flags(fd, FDF_TCP | FDF_KNOWN | (smc ? FDF_SMC : 0) |
		             (domain == AF_INET6 ? FDF_INET6 : 0));
	else
		fd_set_flags(fd, FDF_KNOWN);
	return fd;
}

static int is_tcp_socket(int fd)
{
	uint16_t f = fd_flags(fd);
	int type = 0, proto = 0;
	socklen_t l = sizeof(int);

	if (f & FDF_KNOWN)
		return (f & FDF_TCP) != 0;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0)
		return 0;
	l = sizeof(int);
	sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l);
	return type == SOCK_STREAM && proto == IPPROTO_TCP;
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	REAL(connect);

	if (!smclo_active || !sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
		return real_connect(fd, sa, len);
	if (fd_has_conn(fd)) {
		errno = EISCONN;
		return -1;
	}
	if (!is_tcp_socket(fd))
		return real_connect(fd, sa, len);
	return hs_connect(fd, sa, len);
}

/* A listener taking connections without TCP (direct.c): one of those, or
 * HS_ACCEPT_KERNEL when the kernel has one (or the listener does not). */
static int accept_direct(int lfd, struct sockaddr *sa, socklen_t *len, int flags)
{
	struct ep from;
	int fd;

	if (sa && (int)*len < 0) {
		errno = EINVAL;
		return -1;
	}
	fd = hs_accept_direct(lfd, flags, &from);
	if (fd >= 0 && sa)
		ep_copy_out(&from, (fd_flags(lfd) & FDF_INET6) ? AF_INET6 : AF_INET, sa, len);
	return fd;
}

/*
 * The peer's address is asked of the kernel with the accept itself (no
 * getpeername() later) and copied out as accept() would: truncated to the
 * caller's room, the full length reported.
 */
EXPORT int accept4(int lfd, struct sockaddr *sa, socklen_t *len, int flags)
{
	REAL(accept4);
	struct sockaddr_storage peer;
	socklen_t peer_len = sizeof(peer);
	int fd;

	if (!smclo_active || (sa && !len) || !is_tcp_socket(lfd))
		return real_accept4(lfd, sa, len, flags);
	hs_kernel_accept(lfd, 1);    /* before looking at FDF_DIRECT (direct.c) */
	if (fd_flags(lfd) & FDF_DIRECT) {
		hs_kernel_accept(lfd, -1);
		if ((fd = accept_direct(lfd, sa, len, flags)) != HS_ACCEPT_KERNEL)
			return fd;
		hs_kernel_accept(lfd, 1);
	}
	fd = real_accept4(lfd, (struct sockaddr *)&peer, &peer_len, flags);
	hs_kernel_accept(lfd, -1);
	if (fd < 0)
		return fd;
	if (sa) {
		if ((int)*len < 0) {    /* the kernel drops the connection too */
			sys_close(fd);
			errno = EINVAL;
			return -1;
		}
		memcpy(sa, &peer, *len < peer_len ? *len : peer_len);
		*len = peer_len;
	}
	return hs_accept(lfd, fd, flags, (struct sockaddr *)&peer, peer_len);
}

EXPORT int accept(int lfd, struct sockaddr *sa, socklen_t *len)
{
	return accept4(lfd, sa, len, 0);
}

EXPORT int listen(int fd, int backlog)
{
	REAL(listen);
	int announce = smclo_active && !(fd_flags(fd) & FDF_LISTENING) && is_tcp_socket(fd);
	int rc;

	/* announce a bound listener before it can accept, so an early client finds it */
	if (announce && hs_listen_bound(fd) == 0)
		announce = 0;
	rc = real_listen(fd, backlog);
	if (rc < 0 && (fd_flags(fd) & FDF_LISTENING))
		hs_listener_closed(fd);         /* the entry dies with its lock */
	else if (rc == 0 && announce)
		hs_listen(fd);                  /* the kernel picked the port just now */
	return rc;
}

/* ---- closing ------------------------------------------------------------ */

/* Every close of anything passes here: a plain descriptor costs one load. */
static void forget_fd(int fd)
{
	uint16_t f;

	if (!smclo_active)
		return;
	f = fd_flags(fd);
	/*
	 * A vfork child must not end its parent's connection, listener, epoll
	 * set or handshake.  Asked only then (a system call): a plain socket's
	 * flags cleared by such a child only make the parent ask the kernel
	 * again (FDF_KNOWN gone), so every other close goes without it.
	 */
	if ((fd_has_conn(fd) || (f & (FDF_LISTENING | FDF_EPOLL | FDF_WATCHED | FDF_PENDING))) &&
	    sys_in_vfork_child())
		return;
	if (f & (FDF_WATCHED | FDF_EPOLL))
		watch_fd_closed(fd);
	if (f & FDF_PENDING)
		hs_resolve_fd(fd);      /* bytes written while undecided must arrive */
	if (fd_has_conn(fd))
		conn_close_fd(fd);
	if (f & FDF_LISTENING)
		hs_listener_closed(fd);
	if (f) {
		fd_set_flags(fd, 0);
		fd_epoll_early(fd, 0);
	}
}

/*
 * Daemons close every descriptor they did not open themselves (a close()
 * loop, close_range, closefrom), and so do inetd-style children before they
 * exec a handler: smclo's own descriptors among them (the registry, each
 * connection's state, region and TCP socket) are kept (fd_is_ours).  The
 * program sees them closed, and never gets their numbers back from the
 * kernel anyway (they sit above the program's range).
 */
EXPORT int close(int fd)
{
	REAL(close);

	if (smclo_active && fd_is_ours(fd))
		return 0;
	forget_fd(fd);
	return real_close(fd);
}

/* The first of smclo's own descriptors in [@from, @last], or -1. */
static int next_ours(unsigned from, unsigned last)
{
	int o = fd_next_ours(from, last);

	while (o >= 0 && !fd_is_ours(o))
		o = (unsigned)o < last ? fd_next_ours((unsigned)o + 1, last) : -1;
	/* the registry's may lie above the table (fd_is_ours) */
	if (registry_fd >= 0 && (unsigned)registry_fd >= from && (unsigned)registry_fd <= last &&
	    (o < 0 || registry_fd < o))
		o = registry_fd;
	return o;
}

/*
 * close_range over [@first, @last], around smclo's own descriptors; the
 * connections and listeners among them are forgotten as close() would (a
 * number the kernel hands out again must not still name a connection).
 */
static int close_range_keeping_ours(unsigned first, unsigned last, int flags)
{
	unsigned from = first;
	int high, o;

	if (!smclo_active || (flags & CLOSE_RANGE_CLOEXEC) || first > last)
		return (int)syscall(SYS_close_range, first, last, flags);
	high = fd_table_high();
	for (unsigned fd = first; high >= 0 && fd <= last && fd <= (unsigned)high; fd++)
		if (fd_flags((int)fd) || fd_has_conn((int)fd))
			forget_fd((int)fd);
	for (;; from = (unsigned)o + 1) {
		o = next_ours(from, last);
		if (o < 0)
			break;
		if ((unsigned)o > from && syscall(SYS_close_range, from, (unsigned)o - 1, flags) < 0)
			return -1;
	}
	if (from > last)        /* the last ones were all ours */
		return 0;
	return (int)syscall(SYS_close_range, from, last, flags);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	return close_range_keeping_ours(first, last, flags);
}

EXPORT void closefrom(int lowfd)
{
	if (lowfd < 0)
		lowfd = 0;
	if (close_range_keeping_ours((unsigned)lowfd, ~0U, 0) < 0) {
		/* no close_range (an old kernel): one by one, as glibc would */
		for (int fd = lowfd; fd < fdtab_size; fd++)
			close(fd);
	}
}

EXPORT int shutdown(int fd, int how)
{
	REAL(shutdown);
	struct conn *c = shm_conn(fd);
	int rc;

	if (!c)
		return real_shutdown(fd, how);
	rc = conn_shutdown(c, fd, how);
	conn_put(c);
	return rc;
}

/* ---- receiving ---------------------------------------------------------- */

static ssize_t recv_iov(struct conn *c, int fd, const struct iovec *iov, int n, int flags)
{
	ssize_t r = rx_recv(c, fd, iov, n, flags);

	conn_put(c);
	return r;
}

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	REAL(read);
	struct conn *c = shm_conn_reading(fd, n, 0);
	struct iovec iov = { buf, n };

	return c ? recv_iov(c, fd, &iov, 1, 0) : real_read(fd, buf, n);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	REAL(__read_chk);
	struct conn *c = shm_conn_reading(fd, n, 0);
	struct iovec iov = { buf, n };

	if (c && n <= buflen)
		return recv_iov(c, fd, &iov, 1, 0);
	if (c)
		conn_put(c);
	return real___read_chk(fd, buf, n, buflen);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	REAL(readv);
	struct conn *c = shm_conn(fd);

	return c ? recv_iov(c, fd, iov, n, 0) : real_readv(fd, iov, n);
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	REAL(recv);
	struct conn *c = shm_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	return c ? recv_iov(c, fd, &iov, 1, flags) : real_recv(fd, buf, n, flags);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	REAL(__recv_chk);
	struct conn *c = shm_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (c && n <= buflen)
		return recv_iov(c, fd, &iov, 1, flags);
	if (c)
		conn_put(c);
	return real___recv_chk(fd, buf, n, buflen, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa,
                        socklen_t *len)
{
	REAL(recvfrom);
	struct conn *c = shm_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (!c)
		return real_recvfrom(fd, buf, n, flags, sa, len);
	if (sa && len)
		*len = 0;       /* a connected TCP socket reports no source address */
	return recv_iov(c, fd, &iov, 1, flags);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
                              struct sockaddr *sa, socklen_t *len)
{
	REAL(__recvfrom_chk);
	struct conn *c = shm_conn_reading(fd, n, flags);
	struct iovec iov = { buf, n };

	if (c && n <= buflen) {
		if (sa && len)
			*len = 0;
		return recv_iov(c, fd, &iov, 1, flags);
	}
	if (c)
		conn_put(c);
	return real___recvfrom_chk(fd, buf, n, buflen, flags, sa, len);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	REAL(recvmsg);
	struct conn *c = shm_conn(fd);
	ssize_t r;

	if (!c)         /* descriptors passed to us may be connections */
		return smclo_active && m->msg_controllen && m->msg_control ?
		       passfd_recvmsg(fd, m, flags, real_recvmsg) : real_recvmsg(fd, m, flags);
	r = recv_iov(c, fd, m->msg_iov, (int)m->msg_iovlen, flags);
	if (r >= 0) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

/* ---- sending ------------------------------------------------------------ */

static ssize_t send_iov(struct conn *c, int fd, const struct iovec *iov, int n, int flags)
{
	ssize_t r = tx_send(c, fd, iov, n, flags);

	conn_put(c);
	return r;
}

/*
 * shm_conn() for the sending calls: while the handshake is undecided a
 * small write goes into the ring without waiting for the decision (*sent
 * says how much; -1 when it did not).
 */
static struct conn *shm_conn_send(int fd, const struct iovec *iov, int n, int flags,
                                  ssize_t *sent)
{
	*sent = -1;
	if (smclo_active && (fd_flags(fd) & FDF_PENDING) && !(flags & MSG_OOB)) {
		struct conn *c = conn_get(fd);
		if (c) {
			*sent = tx_send_pending(c, iov, n);
			conn_put(c);
			if (*sent >= 0)
				return NULL;
		}
	}
	return shm_conn(fd);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	REAL(write);
	struct iovec iov = { (void *)buf, n };
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, &iov, 1, 0, &sent);

	if (sent >= 0)
		return sent;
	return c ? send_iov(c, fd, &iov, 1, 0) : real_write(fd, buf, n);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	REAL(writev);
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, iov, n, 0, &sent);

	if (sent >= 0)
		return sent;
	return c ? send_iov(c, fd, iov, n, 0) : real_writev(fd, iov, n);
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	REAL(send);
	struct iovec iov = { (void *)buf, n };
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, &iov, 1, flags, &sent);

	if (sent >= 0)
		return sent;
	return c ? send_iov(c, fd, &iov, 1, flags) : real_send(fd, buf, n, flags);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags,
                      const struct sockaddr *sa, socklen_t len)
{
	REAL(sendto);
	struct iovec iov = { (void *)buf, n };
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, &iov, 1, flags, &sent);

	if (sent >= 0)
		return sent;
	/* a connected TCP socket ignores a destination address */
	return c ? send_iov(c, fd, &iov, 1, flags) : real_sendto(fd, buf, n, flags, sa, len);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	REAL(sendmsg);
	ssize_t sent;
	struct conn *c = shm_conn_send(fd, m->msg_iov, (int)m->msg_iovlen, flags, &sent);

	if (sent >= 0)
		return sent;
	if (c)
		return send_iov(c, fd, m->msg_iov, (int)m->msg_iovlen, flags);
	if (smclo_active && m->msg_controllen && conn_count() > 0)
		return passfd_sendmsg(fd, m, flags, real_sendmsg);
	return real_sendmsg(fd, m, flags);
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	REAL(sendfile);
	struct conn *c = shm_conn(out);
	ssize_t r;

	if (!c)
		return real_sendfile(out, in, off, count);
	r = tx_sendfile(c, out, in, off, count);
	conn_put(c);
	return r;
}

EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	return sendfile(out, in, off, count);
}

/*
 * splice() with an accelerated end.  Into the socket: the source (file or
 * pipe) is read straight into the ring, as sendfile.  Out of the socket:
 * peek, write what the destination takes, then consume exactly that, so a
 * full pipe never loses a byte.
 */
static ssize_t splice_out_of(struct conn *c, int fd, int out, size_t len, unsigned flags)
{
	char buf[65536];
	struct iovec iov = { buf, len < sizeof(buf) ? len : sizeof(buf) };
	int dontwait = (flags & SPLICE_F_NONBLOCK) ? MSG_DONTWAIT : 0;
	ssize_t got = rx_recv(c, fd, &iov, 1, MSG_PEEK | dontwait), put;

	if (got <= 0)
		return got;
	put = sys_write(out, buf, (size_t)got);
	if (put > 0) {
		iov.iov_len = (size_t)put;
		rx_recv(c, fd, &iov, 1, MSG_DONTWAIT);   /* the bytes are there: no wait */
	}
	return put;
}

EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                      unsigned int flags)
{
	REAL(splice);
	struct conn *c;
	ssize_t r;

	if ((c = shm_conn(out)) != NULL) {
		r = tx_sendfile(c, out, in, (off_t *)off_in, len);
		conn_put(c);
		return r;
	}
	if ((c = shm_conn(in)) != NULL) {
		if (off_in) {
			conn_put(c);
			errno = ESPIPE;         /* as for any socket */
			return -1;
		}
		r = splice_out_of(c, in, out, len, flags);
		conn_put(c);
		return r;
	}
	return real_splice(in, off_in, out, off_out, len, flags);
}

/* ---- identity ----------------------------------------------------------- */

EXPORT int getsockopt(int fd, int level, int opt, void *val, socklen_t *len)
{
	REAL(getsockopt);
	struct conn *c = shm_conn(fd);
	int rc;

	if (!c) {
		rc = real_getsockopt(fd, level, opt, val, len);
		/* a fallback AF_SMC socket still says what it was created as */
		if (rc == 0 && level == SOL_SOCKET && opt == SO_DOMAIN && (fd_flags(fd) & FDF_SMC))
			*(int *)val = AF_SMC;
		return rc;
	}
	rc = so_getsockopt(c, fd, level, opt, val, len);
	conn_put(c);
	return rc;
}

EXPORT int setsockopt(int fd, int level, int opt, const void *val, socklen_t len)
{
	REAL(setsockopt);
	struct conn *c = shm_conn(fd);
	int rc;

	if (!c) {
		if (level == SOL_SOCKET && (opt == SO_RCVTIMEO_OLD || opt == SO_SNDTIMEO_OLD ||
		                            opt == SO_RCVTIMEO_NEW || opt == SO_SNDTIMEO_NEW)) {
			fd_add_flags(fd, FDF_TIMEOUTS);
			if (opt == SO_RCVTIMEO_OLD || opt == SO_RCVTIMEO_NEW)
				hs_listener_no_direct(fd);      /* accept() would time out */
		}
		return real_setsockopt(fd, level, opt, val, len);
	}
	rc = so_setsockopt(c, fd, level, opt, val, len);
	conn_put(c);
	return rc;
}

EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	REAL(getsockname);
	struct conn *c = shm_conn(fd);
	int rc;

	if (!c)
		return real_getsockname(fd, sa, len);
	rc = so_name(c, 0, sa, len);
	conn_put(c);
	return rc;
}

EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *len)
{
	REAL(getpeername);
	struct conn *c = shm_conn(fd);
	int rc;

	if (!c)
		return real_getpeername(fd, sa, len);
	rc = so_name(c, 1, sa, len);
	conn_put(c);
	return rc;
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	REAL(ioctl);
	va_list ap;
	void *arg;
	struct conn *c;
	int handled = 0, rc = 0;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	c = shm_conn(fd);
	if (c)
		rc = so_ioctl(c, req, arg, &handled);
	if (!handled)
		rc = real_ioctl(fd, req, arg);
	if (c && req == FIONBIO && rc == 0)
		atomic_store(&c->sh->nonblock, *(int *)arg != 0);
	if (!c && req == FIONBIO && rc == 0 && *(int *)arg)
		hs_listener_no_direct(fd);
	if (c)
		conn_put(c);
	return rc;
}

/* ---- descriptor copies -------------------------------------------------- */

/* @newfd now names what @oldfd names. */
static void copy_binding(int oldfd, int newfd)
{
	struct conn *c;

	if (newfd < 0 || oldfd == newfd || !smclo_active)
		return;
	if ((fd_flags(oldfd) || fd_has_conn(oldfd)) && sys_in_vfork_child())
		return;         /* the parent's table: not ours to change */
	fd_set_flags(newfd, fd_flags(oldfd) & ~(FDF_LISTENING | FDF_WATCHED | FDF_EPOLL | FDF_DIRECT));
	/* an option set through either descriptor is set for both: we no longer know */
	if (fd_flags(oldfd) & FDF_TCP) {
		fd_add_flags(oldfd, FDF_TIMEOUTS);
		fd_add_flags(newfd, FDF_TIMEOUTS);
	}
	watch_epfd_copied(oldfd);
	c = conn_get(oldfd);
	if (c) {
		conn_bind_fd(c, newfd);
		conn_put(c);
	}
}

EXPORT int dup(int fd)
{
	REAL(dup);
	int n;

	if (smclo_active)
		hs_resolve_fd(fd);      /* the copy must name what the decision makes of it */
	n = real_dup(fd);

	copy_binding(fd, n);
	return n;
}

EXPORT int dup2(int fd, int fd2)
{
	REAL(dup2);
	int n;

	if (smclo_active)
		hs_resolve_fd(fd);
	if (fd != fd2 && fcntl(fd, F_GETFD) >= 0)
		forget_fd(fd2);         /* dup2 closes what fd2 was */
	n = real_dup2(fd, fd2);
	copy_binding(fd, n);
	return n;
}

EXPORT int dup3(int fd, int fd2, int flags)
{
	REAL(dup3);
	int n;

	if (smclo_active)
		hs_resolve_fd(fd);
	if (fd != fd2 && fcntl(fd, F_GETFD) >= 0)
		forget_fd(fd2);
	n = real_dup3(fd, fd2, flags);
	copy_binding(fd, n);
	return n;
}

static int fcntl_common(int fd, int cmd, void *arg,
                        int (*real)(int, int, ...))
{
	int rc;

	if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && smclo_active)
		hs_resolve_fd(fd);
	rc = real(fd, cmd, arg);

	if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && rc >= 0)
		copy_binding(fd, rc);
	if (cmd == F_SETFL && rc == 0 && ((long)arg & O_NONBLOCK))
		hs_listener_no_direct(fd);
	if (cmd == F_SETFL && rc == 0 && fd_has_conn(fd)) {
		struct conn *c = shm_conn(fd);
		if (c) {
			atomic_store(&c->sh->nonblock, ((long)arg & O_NONBLOCK) != 0);
			conn_put(c);
		}
	}
	return rc;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	REAL(fcntl);
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(fd, cmd, arg, real_fcntl);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	static int (*cache)(int, int, ...);
	int (*real_fcntl64)(int, int, ...) = __atomic_load_n(&cache, __ATOMIC_RELAXED);
	va_list ap;
	void *arg;

	if (!real_fcntl64) {
		real_fcntl64 = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl64");
		__atomic_store_n(&cache, real_fcntl64, __ATOMIC_RELAXED);
	}
	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(fd, cmd, arg, real_fcntl64);
}

/* ---- epoll (watch.c) ---------------------------------------------------- */

EXPORT int epoll_create(int size)
{
	REAL(epoll_create);
	int fd = real_epoll_create(size);

	if (smclo_active)
		watch_epoll_created(fd);
	return fd;
}

EXPORT int epoll_create1(int flags)
{
	REAL(epoll_create1);
	int fd = real_epoll_create1(flags);

	if (smclo_active)
		watch_epoll_created(fd);
	return fd;
}

/*
 * nginx puts its upstream socket into epoll before connect().  The switch
 * puts the doorbell socket in the descriptor's place, but a registration
 * names the file it was made for (the TCP socket, hidden then): the set
 * would never report the connection again.  Such a socket's connection
 * stays on TCP (R_EPOLL_EARLY, client.c); a registration made after
 * connect() is made on what the switch leaves there (hs_resolve_fd).
 */
static void count_epoll_early(int op, int fd)
{
	uint16_t f = fd_flags(fd);

	if ((f & (FDF_TCP | FDF_LISTENING | FDF_PENDING)) != FDF_TCP || fd_has_conn(fd))
		return;
	if (op == EPOLL_CTL_ADD)
		fd_epoll_early(fd, 1);
	else if (op == EPOLL_CTL_DEL)
		fd_epoll_early(fd, -1);
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	REAL(epoll_ctl);
	int rc;

	if (smclo_active && op != EPOLL_CTL_DEL) {
		hs_resolve_fd(fd);      /* the kernel must watch the descriptor it will be */
		hs_listener_no_direct(fd);      /* it would not see direct connections */
	}
	if (smclo_active && (rc = watch_ctl_parked(epfd, op, fd, ev)) != WATCH_PASS)
		return rc;
	rc = real_epoll_ctl(epfd, op, fd, ev);

	if (rc == 0 && smclo_active) {
		watch_ctl(epfd, op, fd, ev);
		count_epoll_early(op, fd);
	}
	return rc;
}

/*
 * The three epoll waits share one shape: watch.c answers (>= 0), or says the
 * set is not ours, or to sleep in the kernel and show it what woke us: when
 * that was only stale doorbells, the wait goes on for what is left of the
 * timeout.
 */
struct epoll_call {
	int (*wait)(int, struct epoll_event *, int, int);
	int (*pwait)(int, struct epoll_event *, int, int, const sigset_t *);
	int (*pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
	const sigset_t *mask;
	const struct timespec *ts;      /* pwait2's own timeout, for the first sleep */
};

static int timespec_ms(const struct timespec *ts)
{
	long long ms;

	if (!ts)
		return -1;
	ms = ts->tv_sec * 1000LL + (ts->tv_nsec + 999999) / 1000000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static int real_epoll(const struct epoll_call *k, int epfd, struct epoll_event *ev, int max,
                      int timeout, int first)
{
	struct timespec ts = { .tv_sec = timeout / 1000, .tv_nsec = (timeout % 1000) * 1000000L };

	if (k->wait)
		return k->wait(epfd, ev, max, timeout);
	if (k->pwait)
		return k->pwait(epfd, ev, max, timeout, k->mask);
	return k->pwait2(epfd, ev, max, first || timeout < 0 ? k->ts : &ts, k->mask);
}

static int watched_epoll(const struct epoll_call *k, int epfd, struct epoll_event *ev, int max,
                         int timeout)
{
	long long deadline = timeout > 0 ? now_ms() + timeout : 0;

	for (int first = 1;; first = 0) {
		int v = smclo_active ? watch_before_wait(epfd, ev, max, timeout, k->mask == NULL)
		                     : WATCH_PASS;
		int r, e;

		if (v >= 0)
			return v;
		r = real_epoll(k, epfd, ev, max, timeout, first);
		e = errno;
		r = v == WATCH_PASS ? watch_drop_parked(ev, r) : watch_after_sleep(epfd, ev, r);
		errno = e;
		if (r != 0 || timeout == 0)
			return r;
		if (timeout > 0 && (timeout = (int)(deadline - now_ms())) <= 0)
			return 0;
	}
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	REAL(epoll_wait);
	struct epoll_call k = { .wait = real_epoll_wait };

	return watched_epoll(&k, epfd, ev, max, timeout);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
                       const sigset_t *mask)
{
	REAL(epoll_pwait);
	struct epoll_call k = { .pwait = real_epoll_pwait, .mask = mask };

	return watched_epoll(&k, epfd, ev, max, timeout);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *ts,
                        const sigset_t *mask)
{
	REAL(epoll_pwait2);
	struct epoll_call k = { .pwait2 = real_epoll_pwait2, .mask = mask, .ts = ts };
	return watched_epoll(&k, epfd, ev, max, timespec_ms(ts));
}

/* ---- poll and select (pollwait.c) --------------------------------------- */

/*
 * A connection still deciding would be polled as the TCP socket it is now;
 * a listener polled would not show connections without TCP.
 */
static void decide_polled_fd(int fd)
{
	uint16_t f = fd_flags(fd);

	if (f & FDF_PENDING)
		hs_resolve_fd(fd);
	if ((f & (FDF_LISTENING | FDF_NO_DIRECT)) == FDF_LISTENING)
		hs_listener_no_direct(fd);
}

static void decide_polled(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (fds[i].fd >= 0)
			decide_polled_fd(fds[i].fd);
}

static void decide_selected(int nfds, const fd_set *rd, const fd_set *wr, const fd_set *ex)
{
	for (int fd = 0; fd < nfds && fd < FD_SETSIZE; fd++)
		if ((fd_flags(fd) & (FDF_PENDING | FDF_LISTENING)) && ((rd && FD_ISSET(fd, rd)) ||
		    (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex))))
			decide_polled_fd(fd);
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	REAL(poll);

	if (smclo_active)
		decide_polled(fds, n);
	if (smclo_active && pollwait_needed(fds, n))
		return pollwait(fds, n, timeout, NULL);
	return real_poll(fds, n, timeout);
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	(void)fdslen;
	return poll(fds, n, timeout);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	REAL(ppoll);

	if (smclo_active)
		decide_polled(fds, n);
	if (smclo_active && pollwait_needed(fds, n))
		return pollwait(fds, n, timespec_ms(ts), mask);
	return real_ppoll(fds, n, ts, mask);
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
                       const sigset_t *mask, size_t fdslen)
{
	(void)fdslen;
	return ppoll(fds, n, ts, mask);
}

EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	REAL(select);

	if (smclo_active)
		decide_selected(nfds, rd, wr, ex);
	if (smclo_active && selectwait_needed(nfds, rd)) {
		long long ms = tv ? tv->tv_sec * 1000LL + (tv->tv_usec + 999) / 1000 : -1;
		return selectwait(nfds, rd, wr, ex, ms > INT_MAX ? INT_MAX : (int)ms, NULL);
	}
	return real_select(nfds, rd, wr, ex, tv);
}

EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *ts,
                   const sigset_t *mask)
{
	REAL(pselect);

	if (smclo_active)
		decide_selected(nfds, rd, wr, ex);
	if (smclo_active && selectwait_needed(nfds, rd))
		return selectwait(nfds, rd, wr, ex, timespec_ms(ts), mask);
	return real_pselect(nfds, rd, wr, ex, ts, mask);
}
