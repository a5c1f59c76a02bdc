/*
 * proof.c - what the handshake knows of the sockets and processes at both
 * ends: the network namespace a socket lives in, whether a destination is
 * on this host, whether this process uses io_uring (which bypasses libc),
 * who made a socket pair, and the same-connection proof.
 *
 * Same-connection proof: each side hands the other its TCP socket.  The
 * receiver checks that the addresses are mirror images and that both sockets
 * live in one network namespace (where the kernel keeps the 4-tuple unique),
 * or, across namespaces, that the client reached a non-loopback address.
 * Identities come from the kernel: SO_PEERCRED of the pair the server made,
 * the owner of the ring the client made; nothing rests on a random number.
 */
#include "hs_internal.h"

#include <dirent.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <string.h>

uint64_t proof_netns_cookie(int fd)
{
	uint64_t c = 0;
	socklen_t l = sizeof(c);

	sys_getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &c, &l);
	return c;
}

int proof_sock_is_tcp(int fd)
{
	int v = 0;
	socklen_t l = sizeof(v);

	return sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) == 0 && v == IPPROTO_TCP;
}

/* Is @dst an address of our own network namespace? */
int proof_dst_is_local(const struct ep *dst)
{
	struct sockaddr_in6 s = { .sin6_family = AF_INET6 };
	struct sockaddr_in s4 = { .sin_family = AF_INET };
	int v4 = ep_is_v4(dst);
	int fd = sys_socket(v4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int rc;

	if (fd < 0)
		return 0;
	memcpy(&s.sin6_addr, dst->ip, 16);
	memcpy(&s4.sin_addr, dst->ip + 12, 4);
	rc = v4 ? sys_bind(fd, &s4, sizeof(s4)) : sys_bind(fd, &s, sizeof(s));
	sys_close(fd);
	return rc == 0;
}

/*
 * io_uring instances.  One made through liburing is seen (shim/uring.c):
 * each of its submissions is looked at before the kernel reads it, and a
 * connection used there goes to TCP first.  One made any other way (raw
 * system calls, a static liburing, inherited across exec) is not: its
 * process declines every connection (io-uring).  Known rings by descriptor;
 * more than fit here are not known.
 */
#define URINGS_KNOWN 64
static _Atomic int urings_known[URINGS_KNOWN];  /* descriptor + 1; 0: free */
static _Atomic long uring_checked_at = -1000;
static _Atomic int uring_found;                  /* URING_ANY | URING_UNSEEN */
#define URING_ANY 1
#define URING_UNSEEN 2

static int uring_is_known(int fd)
{
	for (int i = 0; i < URINGS_KNOWN; i++)
		if (atomic_load(&urings_known[i]) == fd + 1)
			return 1;
	return 0;
}

int hs_uring_seen(int fd, int on)
{
	int want = on ? 0 : fd + 1, done = 0;

	if (on && uring_is_known(fd))
		return 0;
	for (int i = 0; i < URINGS_KNOWN && !done; i++) {
		int w = want;
		done = atomic_compare_exchange_strong(&urings_known[i], &w, on ? fd + 1 : 0);
	}
	atomic_store(&uring_checked_at, -1000);         /* look again */
	if (on && done)
		fd_for_each_listener(hs_listener_no_direct);    /* a direct one cannot move */
	return done ? 0 : -1;
}

static int uring_scan(void)
{
	long now = mono_now_ms();
	struct dirent *de;
	DIR *d;
	int found = 0;

	if (now - atomic_load(&uring_checked_at) < 100)
		return atomic_load(&uring_found);
	d = opendir("/proc/self/fd");
	while (d && (de = readdir(d)) != NULL) {
		char link[64];
		int fd = atoi(de->d_name);
		ssize_t n;
		/* our own, in the hidden range (a shared inbox's parks alone are
		 * 34): not the program's ring; an fstat is cheaper than a readlink
		 * of /proc, and a stale mark of ours does not hide the program's */
		if (fd_is_hidden(fd) && fd_is_ours(fd))
			continue;
		n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		if (strcmp(link, "anon_inode:[io_uring]") != 0)
			continue;
		found |= URING_ANY;
		if (!uring_is_known(fd))
			found |= URING_UNSEEN;
	}
	if (d)
		closedir(d);
	atomic_store(&uring_found, found);
	atomic_store(&uring_checked_at, now);
	return found;
}

int proof_io_uring_unseen(void)
{
	return (uring_scan() & URING_UNSEEN) != 0;
}

int proof_io_uring_any(void)
{
	return (uring_scan() & URING_ANY) != 0;
}

/* What the socket was created as: known without a system call for the
 * sockets socket() and accept() made here (FDF_INET6). */
int proof_domain_of(int fd)
{
	uint16_t f = fd_flags(fd);
	int v = AF_INET;
	socklen_t l = sizeof(v);

	if (f & FDF_SMC)
		return 43;      /* AF_SMC */
	if (f & FDF_KNOWN)
		return (f & FDF_INET6) ? AF_INET6 : AF_INET;
	sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l);
	return v;
}

/* ---- checks on what the peer handed us ---------------------------------- */

/*
 * The process that made socket pair @s, if its user may attach; else -1.
 * 0: a process in a PID namespace we cannot see (another container's) -
 * allowed all the same, the pid only serves to recognise it (peerid.h).
 */
pid_t proof_peer_pid_allowed(int s, uid_t *uid)
{
	struct ucred cr;
	socklen_t l = sizeof(cr);

	if (sys_getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0 ||
	    !config_uid_allowed(&cfg, cr.uid))
		return -1;
	if (uid)
		*uid = cr.uid;
	return cr.pid;
}

/*
 * The rest of the proof once the addresses of @theirs are known to mirror
 * ours; @peer_uid is the user at the other end, as the kernel names it.  A
 * socket of another network namespace proves nothing about a user who may
 * make one (an unprivileged user namespace chooses its own addresses): only
 * root and users trusted as our own may prove so (docs/security.md).
 */
int proof_same_host(const struct ep *local, uint64_t netns, int theirs, uid_t peer_uid)
{
	if (!proof_sock_is_tcp(theirs))
		return 0;
	if (proof_netns_cookie(theirs) == netns)
		return 1;
	return cfg.cross_netns && !ep_is_loopback(local) &&
	       (peer_uid == 0 || config_uid_trusted(&cfg, peer_uid));
}

/*
 * Is @theirs the other end of our TCP connection @local -> @peer in the
 * namespace @netns?  (see top of file)
 */
int proof_ok(const struct ep *local, const struct ep *peer, uint64_t netns, int theirs,
             uid_t peer_uid)
{
	struct ep tl, tp;

	if (ep_of_socket(theirs, 0, &tl) || ep_of_socket(theirs, 1, &tp) ||
	    !ep_equal(local, &tp) || !ep_equal(peer, &tl))
		return 0;
	return proof_same_host(local, netns, theirs, peer_uid);
}
