/*
 * passfd.c - accelerated descriptors passed to another process with
 * SCM_RIGHTS (a dispatcher handing connections to workers, a helper that
 * connects and passes the socket before it exits, as ssh's ProxyUseFdpass).
 *
 * What the application passes is the doorbell socket.  The receiver also
 * needs the connection's state chunk and region: they travel in the same
 * message, appended after the application's descriptors, and the record
 * that says what they are is left in the registry, h/<ino>.<sender pid>
 * (the record of handover.h, its descriptors numbered from the first
 * appended one, after a line "msg <how many appended>").  The receiver's
 * recvmsg() reads into a larger control buffer, takes the connection over,
 * and hands the application its own descriptors only.  Nothing is left
 * waiting on the sender: it may exit at once.  The receiver is one more
 * holder from the moment the message is sent.
 *
 * A receiver without smclo would read the doorbells as end of file (and
 * find descriptors it never asked for): the sender looks at the processes
 * holding the other end of its socket first (sock_diag names the peer
 * socket, /proc who holds it, their maps whether this library is loaded).
 * Such a process, or one of a user we do not share state with, gets the
 * TCP socket itself: the connection goes on over TCP (moved, handed-on),
 * the sender's descriptor too, what the ring held unread sent again by the
 * peer (hs_hand_on_tcp).  If that cannot be, it gets a reset socket,
 * counted as exec-no-smclo (or the refusal's reason); the connection then
 * ends in a reset for its peer, not an end of file.
 */
#include "passfd.h"
#include "fdtab.h"

#include "config.h"
#include "conn.h"
#include "handshake.h"
#include "region.h"
#include "handover.h"
#include "log.h"
#include "peerinfo.h"
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PARCELS_MAX   64
#define PARCEL_TTL_S  600       /* a receiver that never looked: give up */
#define PASS_MAX      16        /* accelerated descriptors in one message */
#define PARCEL_FDS    4         /* descriptors appended for each (parcel_make) */

/* A parcel not taken yet: its connection counts the receiver as a holder. */
struct parcel {
	char name[64];
	struct conn_shared *sh;
	time_t expires;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct parcel parcels[PARCELS_MAX];
static int n_parcels;

/* A fork child starts with no parcel of its own (they are its parent's to
 * settle) and the lock free (a thread of the parent may have held it). */
void passfd_fork_child(void)
{
	pthread_mutex_init(&lock, NULL);
	n_parcels = 0;
}


static void parcel_release(struct parcel *p, int taken)
{
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
	if ((fd = sys_open_read(path)) < 0)
		return 0;
	n = sys_read(fd, env, sizeof(env) - 1);
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
	const struct timespec moment = { .tv_nsec = 5000000 };

	for (int i = 0; i < 10; i++) {
		if (runs_smclo(pid) != 0)
			return 1;
		nanosleep(&moment, NULL);
	}
	return 0;
}

/*
 * A parcel holds a state chunk shared by up to 256 connections, whose
 * locks and cursors its holder may change: it goes only between users we
 * trust as our own (root may read us anyway), both ways.
 */
static int passfd_user_trusted(uid_t uid)
{
	return uid == 0 || config_uid_trusted(&cfg, uid);
}

/* peerinfo_each_socket: can a process holding the other end not take a parcel? */
static int holder_lacks_smclo(int pid, unsigned long ino, void *arg)
{
	const unsigned long *peer = arg;
	char path[32];
	struct stat st;

	if (ino != *peer)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d", pid);
	if (stat(path, &st) == 0 && !passfd_user_trusted(st.st_uid)) {
		DBG("sendmsg: process %d of uid %u holds the receiving end", pid,
		    (unsigned)st.st_uid);
		return R_DIFF_USER;
	}
	if (settles_on_smclo(pid))
		return 0;
	DBG("sendmsg: process %d holds the receiving end and has no smclo", pid);
	return R_EXEC_NO_SMCLO;
}

/* The user at the other end of @sock: its peer's, or the owner of the path it sends to. */
static int receiver_uid(int sock, const struct msghdr *m, uid_t *uid)
{
	const struct sockaddr_un *to = m->msg_name;
	struct ucred cr;
	socklen_t l = sizeof(cr);
	struct stat st;

	if (sys_getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 && cr.pid) {
		*uid = cr.uid;
		return 0;
	}
	if (to && m->msg_namelen > sizeof(sa_family_t) && to->sun_family == AF_UNIX &&
	    to->sun_path[0] && memchr(to->sun_path, '\0', m->msg_namelen - sizeof(sa_family_t)) &&
	    stat(to->sun_path, &st) == 0) {
		*uid = st.st_uid;
		return 0;
	}
	return -1;
}

/*
 * Can everything that holds the other end of @sock take a parcel?  The
 * holders are found by the socket's inode in /proc/<pid>/fd: SO_PEERCRED
 * names the creator of a socket pair, not whoever holds its other end
 * now.  A parcel carries a chunk of connection state shared with up to 255
 * other connections of ours: never to a user we do not trust as our own
 * (R_DIFF_USER), whether as its socket's creator, its path's owner or a
 * holder we can see.  Nobody found otherwise counts as yes: the parcel is
 * the only way such a receiver can go on.  R_NONE, or why not.
 */
static int receivers_take_parcels(int sock, const struct msghdr *m)
{
	unsigned long peer = peerinfo_unix_peer_ino(sock);
	uid_t uid;

	if (receiver_uid(sock, m, &uid) == 0 && !passfd_user_trusted(uid))
		return R_DIFF_USER;
	return peer ? peerinfo_each_socket(holder_lacks_smclo, &peer) : R_NONE;
}

/*
 * Leave a parcel for @c, whose descriptors go as appended ones number @k to
 * @k + PARCEL_FDS - 1 of @e - its state chunk, its region, and the peer's
 * pool and its wake-up socket if it has them (else the region again, in
 * their places, named by nobody); they are put in @fds.  0 if the
 * receiver can take it.
 */
static int parcel_make(struct conn *c, int k, int e, int fds[PARCEL_FDS])
{
	struct handover_fds at = { .sh = k, .region = k + 1, .tcp = -1, .pool = -1,
	                           .pool_wake = -1 };
	struct parcel *p;
	struct stat st;
	char rec[320];
	uint32_t off;
	int sh_fd, fd, n, ok;

	if (n_parcels == PARCELS_MAX || !c->region || region_memfd(c->region) < 0 ||
	    shared_locate(c->sh, &sh_fd, &off) < 0)
		return -1;
	if (fstat(region_memfd(c->region), &st) < 0)
		return -1;
	p = &parcels[n_parcels];
	snprintf(p->name, sizeof(p->name), "h/%lu.%d", c->bell_ino, (int)sys_getpid());
	/* the region's inode ties the record to the descriptors of this message */
	n = snprintf(rec, sizeof(rec), "msg %d %lu\n", e, (unsigned long)st.st_ino);
	if (c->rx_pool) {
		at.pool = k + 2;
		at.pool_wake = k + 3;
	}
	ok = handover_format(rec + n, sizeof(rec) - (size_t)n, c, off, &at) > 0;
	if (ok)
		unlinkat(registry_fd, p->name, 0);      /* an older one, or a planted link */
	fd = ok ? openat(registry_fd, p->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
	                 0600) : -1;
	ok = fd >= 0 && write(fd, rec, strlen(rec)) == (ssize_t)strlen(rec);
	if (fd >= 0)
		sys_close(fd);
	if (!ok) {
		unlinkat(registry_fd, p->name, 0);
		return -1;
	}
	fds[0] = sh_fd;
	fds[1] = region_memfd(c->region);
	fds[2] = c->rx_pool ? c->rx_pool_fd : fds[1];
	fds[3] = c->rx_pool ? c->pool_wake_fd : fds[1];
	p->sh = c->sh;
	p->expires = time(NULL) + PARCEL_TTL_S;
	atomic_fetch_add(&c->sh->holders, 1);
	n_parcels++;
	return 0;
}

/* The accelerated descriptors among those @m passes; how many. */
static int passed(const struct msghdr *m, int *out[PASS_MAX])
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
				out[n++] = &fds[i];
	}
	return n;
}

/* Can @c go with a parcel (passfd_sendmsg's first pass)? */
static int parcel_possible(const struct conn *c)
{
	int fd;
	uint32_t off;

	return c->mode == MODE_SHM && c->region && region_memfd(c->region) >= 0 &&
	       shared_locate(c->sh, &fd, &off) == 0;
}

/*
 * The parcels' descriptors go along, after the application's, in one more
 * SCM_RIGHTS message of @copy (its control buffer has room: passfd_sendmsg).
 * A parcel written for a connection that then could not be made keeps its
 * numbers, so the gap is filled with the first one's.
 */
static void passfd_append_state(struct msghdr *copy, size_t app_len, int *extra, int n_made,
                                int e)
{
	struct cmsghdr *h = (struct cmsghdr *)((char *)copy->msg_control + CMSG_ALIGN(app_len));

	for (int i = PARCEL_FDS * n_made; i < e; i++)
		extra[i] = extra[0];
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN((size_t)e * sizeof(int));
	memcpy(CMSG_DATA(h), extra, (size_t)e * sizeof(int));
	copy->msg_controllen = CMSG_ALIGN(app_len) + CMSG_SPACE((size_t)e * sizeof(int));
}

/* Not sent: take back this call's parcels, by name (other threads may have
 * added or swept some meanwhile). */
static void passfd_take_back(char made[][64], int n_made)
{
	pthread_mutex_lock(&lock);
	for (int k = 0; k < n_made; k++)
		for (int i = 0; i < n_parcels; i++)
			if (!strcmp(parcels[i].name, made[k])) {
				unlinkat(registry_fd, parcels[i].name, 0);
				parcel_release(&parcels[i], 0);
				break;
			}
	pthread_mutex_unlock(&lock);
}

/*
 * The connections behind the @n descriptors passed (decided first, each
 * referenced in @conns, NULL for anything else); returns how many of our
 * descriptors their parcels will add.
 */
static int passfd_conns(int **where, int n, int refused, struct conn **conns)
{
	int e = 0;

	for (int i = 0; i < n; i++) {
		int fd = *where[i];

		hs_resolve_fd(fd);
		conns[i] = fd_get_conn(fd);
		if (conns[i] && !refused && parcel_possible(conns[i]))
			e += PARCEL_FDS;
	}
	return e;
}

ssize_t passfd_sendmsg(int sock, const struct msghdr *m, int flags,
                       ssize_t (*real)(int, const struct msghdr *, int))
{
	const size_t more = CMSG_SPACE(PARCEL_FDS * PASS_MAX * sizeof(int));
	char control[m->msg_controllen + more];
	struct msghdr copy = *m;
	struct conn *conns[PASS_MAX];
	int *where[PASS_MAX] = { 0 }, resets[PASS_MAX], extra[PARCEL_FDS * PASS_MAX];
	int n_resets = 0, n, n_made = 0, e, refused;
	char made[PASS_MAX][64];
	ssize_t r;

	memcpy(control, m->msg_control, m->msg_controllen);
	copy.msg_control = control;
	if (!(n = passed(&copy, where)))
		return real(sock, m, flags);
	refused = receivers_take_parcels(sock, m);
	e = passfd_conns(where, n, refused, conns);
	pthread_mutex_lock(&lock);
	parcels_sweep();
	for (int i = 0; i < n; i++) {
		struct conn *c = conns[i];

		if (!c || c->mode != MODE_SHM)
			continue;
		if (!refused && parcel_possible(c) &&
		    parcel_make(c, PARCEL_FDS * n_made, e, &extra[PARCEL_FDS * n_made]) == 0) {
			snprintf(made[n_made], sizeof(made[0]), "%s", parcels[n_parcels - 1].name);
			n_made++;
			continue;
		}
		/* the TCP socket itself goes, what the ring held sent again
		 * by the peer; in this process too (the number names it now) */
		if (hs_hand_on_tcp(*where[i], c) == 0)
			continue;
		/* a reset socket in its place: never a doorbell to misread */
		int s = sys_socket(AF_INET, SOCK_STREAM, 0);
		if (s >= 0) {
			*where[i] = resets[n_resets++] = s;
			atomic_fetch_or(&c->sh->flags, SH_ABORT_AT_CLOSE);
			if (totals)
				atomic_fetch_add(&totals->fallback[refused ? refused :
				                                   R_EXEC_NO_SMCLO], 1);
		}
	}
	pthread_mutex_unlock(&lock);
	if (n_made)
		passfd_append_state(&copy, m->msg_controllen, extra, n_made, e);
	r = real(sock, &copy, flags);
	if (r < 0 && n_made) {
		int err = errno;

		passfd_take_back(made, n_made);
		n_made = 0;
		errno = err;
	}
	sys_close_all(resets, n_resets);
	for (int i = 0; i < n; i++)
		if (conns[i])
			conn_put(conns[i]);
	if (n_made)
		DBG("sendmsg fd %d: %d connection(s) passed with a parcel", sock, n_made);
	return r;
}

/*
 * Does parcel text @rec belong to the message whose descriptors are
 * @fds[0..@n), the passed socket at @i?  Then the number of descriptors
 * appended at its end, and *@sh, *@region their positions; else -1.
 */
static int parcel_fits(const char *rec, const int *fds, int n, int i, struct handover_fds *at)
{
	const char *r = strchr(rec, '\n'), *tail = strrchr(rec, ',');
	unsigned long rino, ino;
	struct stat st;
	int e, sh, region, pool, wake;

	/* the record names the very socket that came, and state that came
	 * with it; its last two fields, the peer's pool (or -1, -1) */
	while (tail && tail > rec && *--tail != ',')
		;
	if (!r || !tail || sscanf(rec, "msg %d %lu\n", &e, &rino) != 2 || e <= 0 ||
	    e > n - i - 1 || sscanf(r + 1, "%lu,%d,%*[0-9],%d,", &ino, &sh, &region) != 3 ||
	    sscanf(tail, ",%d,%d", &pool, &wake) != 2 ||
	    fstat(fds[i], &st) < 0 || st.st_ino != ino ||
	    sh < 0 || sh >= e || region < 0 || region >= e ||
	    (pool != -1 && (pool < 0 || pool >= e || wake < 0 || wake >= e)))
		return -1;
	at->sh = fds[n - e + sh];
	at->region = fds[n - e + region];
	at->tcp = -1;   /* no TCP socket travels */
	at->pool = pool < 0 ? -1 : fds[n - e + pool];
	at->pool_wake = pool < 0 ? -1 : fds[n - e + wake];
	return fstat(at->region, &st) == 0 && st.st_ino == rino ? e : -1;
}

/*
 * Take over the connection passed as @fds[@i], if there is a parcel for it
 * and this message (another socket that had its inode once may have left
 * one): how many descriptors came appended for the message, or 0.
 */
static int take_one(const int *fds, int n, int i)
{
	char prefix[32], name[300], rec[320];
	int dfd, appended = 0;
	struct dirent *e;
	struct stat st;
	DIR *d;

	if (fstat(fds[i], &st) < 0 || !S_ISSOCK(st.st_mode))
		return 0;
	snprintf(prefix, sizeof(prefix), "%lu.", (unsigned long)st.st_ino);
	dfd = openat(registry_fd, "h", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || !(d = fdopendir(dfd))) {
		if (dfd >= 0)
			sys_close(dfd);
		return 0;
	}
	while (!appended && (e = readdir(d))) {
		struct handover_fds at;
		struct stat fst;
		int f;
		ssize_t len;

		if (strncmp(e->d_name, prefix, strlen(prefix)))
			continue;
		snprintf(name, sizeof(name), "h/%s", e->d_name);
		f = registry_open_read(registry_fd, name);
		/* written by a user trusted as our own: its state chunk is mapped */
		if (f >= 0 && (fstat(f, &fst) < 0 || !S_ISREG(fst.st_mode) ||
		               !passfd_user_trusted(fst.st_uid))) {
			sys_close(f);
			f = -1;
		}
		len = f >= 0 ? read(f, rec, sizeof(rec) - 1) : -1;
		if (f >= 0)
			sys_close(f);
		if (len <= 0)
			continue;
		rec[len] = '\0';
		if ((appended = parcel_fits(rec, fds, n, i, &at)) < 0) {
			appended = 0;
			continue;
		}
		unlinkat(registry_fd, name, 0);         /* tells the sender it was taken */
		if (handover_take(strchr(rec, '\n') + 1, &at) == 0)
			DBG("recvmsg: took over a connection passed on descriptor %d", fds[i]);
	}
	closedir(d);
	return appended;
}

/*
 * The descriptors @fds[0..@n) of a message just received: take over the
 * passed connections among them; returns how many at the end are ours
 * (appended by the sender, closed here).
 */
static int take_passed(int *fds, int n)
{
	int appended = 0;

	for (int i = 0; i < n - appended; i++) {
		int e = take_one(fds, n, i);
		if (e)
			appended = e;
	}
	for (int i = n - appended; i < n; i++)
		sys_close(fds[i]);
	return appended;
}

/* Append a control message to @out, as the kernel would: truncated to what fits. */
static void put_cmsg(struct msghdr *out, size_t *used, const struct cmsghdr *h, int nfds)
{
	size_t room = out->msg_controllen - *used, data = h->cmsg_len - CMSG_LEN(0);
	struct cmsghdr *o = (struct cmsghdr *)((char *)out->msg_control + *used);
	int *fds = (int *)CMSG_DATA(h);

	if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
		data = (size_t)nfds * sizeof(int);
	if (room < CMSG_LEN(0)) {
		out->msg_flags |= MSG_CTRUNC;
		data = 0;
	} else if (CMSG_LEN(data) > room) {
		out->msg_flags |= MSG_CTRUNC;
		data = h->cmsg_type == SCM_RIGHTS ? (room - CMSG_LEN(0)) / sizeof(int) * sizeof(int) :
		       room - CMSG_LEN(0);
	}
	if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
		for (size_t i = data / sizeof(int); i < (size_t)nfds; i++)
			sys_close(fds[i]);      /* what did not fit is closed, as by the kernel */
	if (room < CMSG_LEN(0))
		return;
	o->cmsg_level = h->cmsg_level;
	o->cmsg_type = h->cmsg_type;
	o->cmsg_len = CMSG_LEN(data);
	memcpy(CMSG_DATA(o), CMSG_DATA(h), data);
	*used += CMSG_SPACE(data) < room ? CMSG_SPACE(data) : room;
}

ssize_t passfd_recvmsg(int sock, struct msghdr *m, int flags,
                       ssize_t (*real)(int, struct msghdr *, int))
{
	char control[m->msg_controllen + CMSG_SPACE(2 * PASS_MAX * sizeof(int))];
	struct msghdr mine = *m;
	size_t used = 0;
	ssize_t r;

	mine.msg_control = control;
	mine.msg_controllen = sizeof(control);
	r = real(sock, &mine, flags);
	if (r < 0)
		return r;
	m->msg_namelen = mine.msg_namelen;
	m->msg_flags = mine.msg_flags & ~MSG_CTRUNC;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&mine); h; h = CMSG_NXTHDR(&mine, h)) {
		int n = 0;

		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
			n = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			n -= take_passed((int *)CMSG_DATA(h), n);
		}
		put_cmsg(m, &used, h, n);
	}
	m->msg_controllen = used;
	return r;
}
