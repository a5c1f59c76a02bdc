/*
 * passfd.c - accelerated descriptors passed to another process with
 * SCM_RIGHTS (a dispatcher handing connections to workers, a privileged
 * parent passing them to a sandbox).
 *
 * What travels is the doorbell socket.  The receiver also needs the
 * connection's state chunk and region: the sender leaves a parcel in the
 * registry, h/<ino>.<sender pid>, holding the connection's record
 * (handover.h) with the numbers of descriptors it keeps open for the
 * purpose, and the receiver's smclo opens them through /proc/<pid>/fd (same
 * user, as the registry already requires) when recvmsg() brings the socket
 * in.  The receiver is one more holder from the moment the message is sent.
 *
 * A receiver without smclo would read the doorbells as end of file: the
 * sender looks at the processes holding the other end of its socket first
 * (sock_diag names the peer socket, /proc who holds it, their maps whether
 * this library is loaded) and passes such a process a reset socket
 * instead, counted as exec-no-smclo; the connection then ends in a reset
 * for its peer, not an end of file.  The sender's own descriptor is never
 * touched.
 */
#include "passfd.h"

#include "conn.h"
#include "handshake.h"
#include "region.h"
#include "handover.h"
#include "log.h"
#include "registry.h"
#include "sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PARCELS_MAX   64
#define PARCEL_TTL_S  30        /* a receiver that never looked: give up */
#define PASS_MAX      16        /* accelerated descriptors in one message */

/* What a parcel keeps open until the receiver took it (or gave up). */
struct parcel {
	char name[64];
	int fds[3];
	struct conn_shared *sh;         /* counted as held by the receiver */
	time_t expires;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct parcel parcels[PARCELS_MAX];
static int n_parcels;

static void parcel_release(struct parcel *p, int taken)
{
	for (int i = 0; i < 3; i++)
		if (p->fds[i] >= 0)
			sys_close(p->fds[i]);
	/* nobody took it: the receiver does not hold the connection after all */
	if (!taken)
		atomic_fetch_sub(&p->sh->holders, 1);
	*p = parcels[--n_parcels];
}

/* Drop the parcels their receivers took (the file is gone) or that expired. */
static void parcels_sweep(void)
{
	time_t now = time(NULL);

	for (int i = 0; i < n_parcels;) {
		struct parcel *p = &parcels[i];
		int gone = faccessat(registry_fd, p->name, F_OK, AT_SYMLINK_NOFOLLOW) < 0;

		if (gone || now > p->expires) {
			if (!gone)
				unlinkat(registry_fd, p->name, 0);
			parcel_release(p, gone);
		} else {
			i++;
		}
	}
}

/* Is @pid starting up with this library in LD_PRELOAD (loading it now)? */
static int preloads_smclo(pid_t pid)
{
	char path[64], env[8192];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	n = read(fd, env, sizeof(env) - 1);
	sys_close(fd);
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(env + i) + 1) {
		env[n] = '\0';
		if (!strncmp(env + i, "LD_PRELOAD=", 11) && strstr(env + i, "libsmclo"))
			return 1;
	}
	return 0;
}

/*
 * Does process @pid have this library loaded (so it can take a parcel)?
 * 1 yes, 0 no, -1 cannot tell (an exiting process has no mappings left
 * while it still holds its descriptors).  A program that has just been
 * exec'd holds its descriptors before the loader maps its preloads: its
 * environment says whether it is about to.
 */
static int runs_smclo(pid_t pid)
{
	char path[64], line[512];
	int found = 0, lines = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	if (!(f = fopen(path, "re")))
		return -1;
	while (!found && fgets(line, sizeof(line), f)) {
		lines++;
		found = strstr(line, "/libsmclo.so") != NULL;
	}
	fclose(f);
	if (!found && lines && preloads_smclo(pid))
		found = 1;
	return found ? 1 : lines ? 0 : -1;
}

/*
 * runs_smclo, asked again for a moment when the answer is no: a program in
 * the middle of its exec shows neither its new mappings nor its new
 * environment yet.
 */
static int settles_on_smclo(pid_t pid)
{
	for (int i = 0; i < 10; i++) {
		if (runs_smclo(pid) != 0)
			return 1;
		usleep(5000);
	}
	return 0;
}

/* The inode of the socket at the other end of unix socket @sock (sock_diag). */
static unsigned long unix_peer_ino(int sock)
{
	struct {
		struct nlmsghdr nh;
		struct unix_diag_req req;
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		        .nlmsg_flags = NLM_F_REQUEST },
		.req = { .sdiag_family = AF_UNIX, .udiag_states = ~0u, .udiag_show = UDIAG_SHOW_PEER,
		         .udiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } },
	};
	struct stat st;
	long buf[1024];
	unsigned long peer = 0;
	int nl;
	ssize_t n;

	if (fstat(sock, &st) < 0)
		return 0;
	q.req.udiag_ino = (unsigned)st.st_ino;
	nl = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return 0;
	if (send(nl, &q, sizeof(q), 0) == sizeof(q) && (n = recv(nl, buf, sizeof(buf), 0)) > 0) {
		struct nlmsghdr *h = (struct nlmsghdr *)buf;
		if (NLMSG_OK(h, (size_t)n) && h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
			struct unix_diag_msg *m = NLMSG_DATA(h);
			struct rtattr *a = (struct rtattr *)(m + 1);
			int len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
			for (; RTA_OK(a, len); a = RTA_NEXT(a, len))
				if (a->rta_type == UNIX_DIAG_PEER)
					peer = *(uint32_t *)RTA_DATA(a);
		}
	}
	sys_close(nl);
	return peer;
}

/*
 * Can everything that holds the other end of @sock take a parcel?  The
 * holders are found by the socket's inode in /proc/<pid>/fd: SO_PEERCRED
 * names the creator of a socket pair, not whoever holds its other end
 * now.  Nobody found (a process we may not look at) counts as yes: the
 * parcel is the only way such a receiver can go on.
 */
static int receivers_run_smclo(int sock)
{
	unsigned long peer = unix_peer_ino(sock);
	char want[40], path[600], link[64];
	int ok = 1;
	DIR *procs;
	struct dirent *p;

	if (!peer || !(procs = opendir("/proc")))
		return 1;
	snprintf(want, sizeof(want), "socket:[%lu]", peer);
	while (ok && (p = readdir(procs))) {
		DIR *fds;
		struct dirent *f;
		int holds = 0;

		if (p->d_name[0] < '1' || p->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd", p->d_name);
		if (!(fds = opendir(path)))
			continue;
		while (!holds && (f = readdir(fds))) {
			ssize_t n;
			snprintf(path, sizeof(path), "/proc/%s/fd/%s", p->d_name, f->d_name);
			n = readlink(path, link, sizeof(link) - 1);
			holds = n > 0 && (link[n] = '\0', !strcmp(link, want));
		}
		closedir(fds);
		if (holds && !settles_on_smclo(atoi(p->d_name))) {
			DBG("sendmsg: process %s holds the receiving end and has no smclo", p->d_name);
			ok = 0;
		}
	}
	closedir(procs);
	return ok;
}

/* Leave a parcel for @c; 0 if the receiver can take it. */
static int parcel_make(struct conn *c)
{
	struct parcel *p;
	char rec[256];
	uint32_t off;
	int sh_fd, fd, ok;

	if (n_parcels == PARCELS_MAX || !c->region || region_memfd(c->region) < 0 ||
	    conn_shared_locate(c->sh, &sh_fd, &off) < 0)
		return -1;
	p = &parcels[n_parcels];
	p->fds[0] = fd_dup_hidden(sh_fd);
	p->fds[1] = fd_dup_hidden(region_memfd(c->region));
	p->fds[2] = -1;
	snprintf(p->name, sizeof(p->name), "h/%lu.%d", c->bell_ino, (int)sys_getpid());
	ok = p->fds[0] >= 0 && p->fds[1] >= 0 &&
	     handover_format(rec, sizeof(rec), c, p->fds[0], off, p->fds[1], -1) > 0;
	fd = ok ? openat(registry_fd, p->name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
	ok = fd >= 0 && write(fd, rec, strlen(rec)) == (ssize_t)strlen(rec);
	if (fd >= 0)
		sys_close(fd);
	if (!ok) {
		unlinkat(registry_fd, p->name, 0);
		for (int i = 0; i < 2; i++)
			if (p->fds[i] >= 0)
				sys_close(p->fds[i]);
		return -1;
	}
	p->sh = c->sh;
	p->expires = time(NULL) + PARCEL_TTL_S;
	atomic_fetch_add(&c->sh->holders, 1);
	n_parcels++;
	return 0;
}

/* The accelerated descriptors among those @m passes; how many. */
static int passed(const struct msghdr *m, int *slots[PASS_MAX])
{
	int n = 0;

	for (struct cmsghdr *h = CMSG_FIRSTHDR((struct msghdr *)m); h;
	     h = CMSG_NXTHDR((struct msghdr *)m, h)) {
		int *fds = (int *)CMSG_DATA(h);
		size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < k && n < PASS_MAX; i++)
			if (fd_has_conn(fds[i]))
				slots[n++] = &fds[i];
	}
	return n;
}

ssize_t passfd_sendmsg(int sock, const struct msghdr *m, int flags,
                       ssize_t (*real)(int, const struct msghdr *, int))
{
	char control[m->msg_controllen ? m->msg_controllen : 1];
	struct msghdr copy = *m;
	int *slots[PASS_MAX], resets[PASS_MAX], n_resets = 0, n, n_made = 0, smclo_peer;
	ssize_t r;

	memcpy(control, m->msg_control, m->msg_controllen);
	copy.msg_control = control;
	if (!(n = passed(&copy, slots)))
		return real(sock, m, flags);
	smclo_peer = receivers_run_smclo(sock);
	pthread_mutex_lock(&lock);
	parcels_sweep();
	for (int i = 0; i < n; i++) {
		struct conn *c;

		hs_resolve_fd(*slots[i]);
		if (!(c = conn_get(*slots[i])))
			continue;
		if (c->mode == MODE_SHM && !(smclo_peer && parcel_make(c) == 0)) {
			/* a reset socket in its place: never a doorbell to misread */
			int s = sys_socket(AF_INET, SOCK_STREAM, 0);
			if (s >= 0) {
				*slots[i] = resets[n_resets++] = s;
				atomic_fetch_or(&c->sh->flags, SH_ABORT_AT_CLOSE);
				if (totals)
					atomic_fetch_add(&totals->fallback[R_EXEC_NO_SMCLO], 1);
			}
		} else if (c->mode == MODE_SHM) {
			n_made++;
		}
		conn_put(c);
	}
	pthread_mutex_unlock(&lock);
	r = real(sock, &copy, flags);
	if (r < 0 && n_made) {
		int e = errno;
		pthread_mutex_lock(&lock);
		for (int i = n_parcels - 1; i >= 0 && n_made; i--, n_made--) {
			unlinkat(registry_fd, parcels[i].name, 0);
			parcel_release(&parcels[i], 0);
		}
		pthread_mutex_unlock(&lock);
		errno = e;
	}
	for (int i = 0; i < n_resets; i++)
		sys_close(resets[i]);
	if (n_made)
		DBG("sendmsg fd %d: %d connection(s) passed with a parcel", sock, n_made);
	return r;
}

/* A descriptor just received: a connection someone passed us? */
static void take_parcel(int fd)
{
	struct stat st;
	char prefix[32], name[300], rec[256];
	DIR *d;
	struct dirent *e;
	int dfd, found = 0;

	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return;
	snprintf(prefix, sizeof(prefix), "%lu.", (unsigned long)st.st_ino);
	dfd = openat(registry_fd, "h", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || !(d = fdopendir(dfd))) {
		if (dfd >= 0)
			sys_close(dfd);
		return;
	}
	while (!found && (e = readdir(d))) {
		ssize_t n;
		int f;

		pid_t from;

		if (strncmp(e->d_name, prefix, strlen(prefix)))
			continue;
		snprintf(name, sizeof(name), "h/%s", e->d_name);
		from = atoi(e->d_name + strlen(prefix));
		if (from <= 0 || (kill(from, 0) < 0 && errno == ESRCH)) {
			unlinkat(registry_fd, name, 0);  /* a dead sender's, for an older socket */
			continue;
		}
		f = openat(registry_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		n = f >= 0 ? read(f, rec, sizeof(rec) - 1) : -1;
		if (f >= 0)
			sys_close(f);
		if (n <= 0)
			continue;
		rec[n] = '\0';
		found = 1;
		if (handover_take(rec, from) == 0)
			DBG("recvmsg: took over a connection passed on descriptor %d", fd);
		unlinkat(registry_fd, name, 0);         /* tells the sender it was taken */
	}
	closedir(d);
}

void passfd_received(const struct msghdr *m)
{
	for (struct cmsghdr *h = CMSG_FIRSTHDR((struct msghdr *)m); h;
	     h = CMSG_NXTHDR((struct msghdr *)m, h)) {
		int *fds = (int *)CMSG_DATA(h);
		size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < k; i++)
				take_parcel(fds[i]);
	}
}
