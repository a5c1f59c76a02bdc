/*
 * registry.c - listener entries, rendezvous sockets and liveness locks (registry.h).
 */
#include "registry.h"

#include "config.h"
#include "log.h"
#include "peerinfo.h"
#include "sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *const subdirs[] = { "l", "p", "c", "i", "t", "h" };

/* Files take the directory's permissions: private dirs get private files. */
static mode_t file_mode = 0600;
static uid_t dir_owner;
static mode_t dir_mode;

static int listeners_added(int dirfd, uint64_t *n);
static void listeners_count(int dirfd);
static void port_note_unlistened(uint16_t port, uint64_t added);

int registry_is_shared(void)
{
	return (file_mode & 022) != 0;
}

int registry_usable_by(uid_t uid)
{
	mode_t need = uid == dir_owner ? 0300 : 0003;

	return uid == 0 || (dir_mode & need) == need;
}

int registry_open_mappable(int dirfd, const char *path, uid_t owner)
{
	struct stat st;
	int fd = openat(dirfd, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0)
		return -1;
	fchmod(fd, file_mode & ~(mode_t)022);   /* readable as the directory says; fails if not ours */
	/* root made it in a directory of another user's (a container's volume,
	 * looked at from the host): the directory's owner's, or they could never
	 * open it again.  Only a file root owns: nobody else can make one */
	if (geteuid() == 0 && owner != 0 && fstat(fd, &st) == 0 && st.st_uid == 0 &&
	    fchown(fd, owner, (gid_t)-1) < 0)
		DBG("%s: cannot give it to uid %u: %s", path, (unsigned)owner, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != owner ||
	    (st.st_mode & 022)) {
		sys_close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

int registry_open_read(int dirfd, const char *path)
{
	struct stat st;
	int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

	if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

void *registry_map_backed(int fd, size_t len)
{
	int err = posix_fallocate(fd, 0, (off_t)len);
	void *p;

	if (err) {
		errno = err;
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int mkdir_checked(const char *path, mode_t mode, int must_be_private,
                         char *err, size_t errlen)
{
	struct stat st;

	if (mkdir(path, mode) < 0 && errno != EEXIST) {
		snprintf(err, errlen, "registry %s: %s", path, strerror(errno));
		return -1;
	}
	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "registry %s: not a directory", path);
		return -1;
	}
	/* the default lives in a world-writable place: refuse anything we did not make */
	if (must_be_private && (st.st_uid != getuid() || (st.st_mode & 077))) {
		snprintf(err, errlen, "registry %s: must be owned by uid %u with mode 0700",
		         path, (unsigned)getuid());
		return -1;
	}
	return 0;
}

int registry_fd = -1;

/*
 * Subdirectory @sub of the registry @dfd (its status @st), made if missing.
 * A shared directory passes its permissions on to what we make, and root
 * (`smclo stat` run on the host first) its owner too: a subdirectory left
 * at 0700, or root's, would shut the registry's users out.
 */
static int registry_subdir_make(int dfd, const char *sub, const struct stat *st)
{
	int fd, rc = 0;

	if (mkdirat(dfd, sub, 0700) < 0)
		return errno == EEXIST ? 0 : -1;
	/* by descriptor, never by name: whoever may write the registry could put
	 * a link to any file of ours under that name meanwhile */
	fd = openat(dfd, sub, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fchmod(fd, st->st_mode & 07777) < 0 ||
	    (geteuid() == 0 && st->st_uid != 0 && fchown(fd, st->st_uid, st->st_gid) < 0))
		rc = -1;
	close(fd);
	return rc;
}

/* Open @dir, a registry directory made (or checked) already, with its subdirectories. */
static int registry_open_dir(const char *dir, char *err, size_t errlen)
{
	struct stat st;
	int dfd = open(dir, O_DIRECTORY | O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (dfd < 0 || fstat(dfd, &st) < 0) {
		snprintf(err, errlen, "registry %s: %s", dir, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	file_mode = st.st_mode & 0666;
	dir_owner = st.st_uid;
	dir_mode = st.st_mode & 07777;
	for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
		if (registry_subdir_make(dfd, subdirs[i], &st) < 0) {
			snprintf(err, errlen, "registry %s/%s: %s", dir, subdirs[i], strerror(errno));
			close(dfd);
			return -1;
		}
	}
	return dfd;
}

static char private_why[160];

const char *registry_private_why(void)
{
	return private_why[0] ? private_why : NULL;
}

/*
 * Is @path (relative to @dfd, or @dfd itself for "") as the shared registry
 * must be: a directory of root's, everyone's to write in, sticky - so
 * nobody but root and a file's owner removes or renames what is in it.  A
 * directory another user made could be emptied or rearranged by that user.
 */
static int shared_dir_ok(int dfd, const char *path)
{
	struct stat st;

	return fstatat(dfd, path, &st, AT_SYMLINK_NOFOLLOW | (*path ? 0 : AT_EMPTY_PATH)) == 0 &&
	       S_ISDIR(st.st_mode) && st.st_uid == 0 && (st.st_mode & 07777) == 01777;
}

/*
 * Root makes the shared registry and its subdirectories; nobody else may.
 * The mode is set after mkdir, which the umask would cut; a directory left
 * at 0700 by a failed chmod is removed again, never left for others.
 */
static void shared_mkdir(int dfd, const char *path)
{
	struct stat st;
	int fd;

	if (mkdirat(dfd, path, 0700) < 0)
		return;
	/* by descriptor: never a chmod through a link put under the name */
	fd = openat(dfd, path, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_uid != 0 || fchmod(fd, 01777) < 0))
		unlinkat(dfd, path, AT_REMOVEDIR);
	if (fd >= 0)
		close(fd);
}

static void shared_make(const char *dir)
{
	int dfd;

	if (geteuid() != 0)
		return;
	shared_mkdir(AT_FDCWD, dir);
	dfd = open(dir, O_DIRECTORY | O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (dfd < 0)
		return;
	/* only inside a directory no one else can rearrange (root's, sticky) */
	if (shared_dir_ok(dfd, ""))
		for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++)
			shared_mkdir(dfd, subdirs[i]);
	close(dfd);
}

/* The shared registry, checked throughout; -1 with private_why set if unusable. */
static int registry_open_shared(char *err, size_t errlen)
{
	int dfd, ok;

	shared_make(SMCLO_SHARED_DIR);
	dfd = open(SMCLO_SHARED_DIR, O_DIRECTORY | O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (dfd < 0) {
		snprintf(private_why, sizeof(private_why), "%s: %s (root makes it: smclo.conf in "
		         "tmpfiles.d)", SMCLO_SHARED_DIR, strerror(errno));
		return -1;
	}
	ok = shared_dir_ok(dfd, "");
	for (size_t i = 0; ok && i < sizeof(subdirs) / sizeof(subdirs[0]); i++)
		ok = shared_dir_ok(dfd, subdirs[i]);
	close(dfd);
	if (!ok) {
		snprintf(private_why, sizeof(private_why), "%s: it and its subdirectories must be "
		         "root's with mode 1777", SMCLO_SHARED_DIR);
		return -1;
	}
	return registry_open_dir(SMCLO_SHARED_DIR, err, errlen);
}

int registry_open(const char *dir, int is_default, char *err, size_t errlen)
{
	char own[sizeof(SMCLO_SHARED_DIR) + 16];
	int dfd;

	private_why[0] = '\0';
	if (!is_default)
		return mkdir_checked(dir, 0700, 0, err, errlen) < 0 ? -1 :
		       registry_open_dir(dir, err, errlen);
	if ((dfd = registry_open_shared(err, errlen)) >= 0)
		return dfd;
	/* this user's own, where only this user's peers are found */
	config_private_dir(own, sizeof(own));
	if (mkdir_checked(own, 0700, 1, err, errlen) < 0)
		return -1;
	return registry_open_dir(own, err, errlen);
}

int registry_entry_path(char out[REGISTRY_PATH_MAX], const char *sub, const char *name)
{
	int n = snprintf(out, REGISTRY_PATH_MAX, "%s/%s", sub, name);

	if (n < 0 || n >= REGISTRY_PATH_MAX) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

void registry_entry_remove(int dirfd, const char *sub, const char *name)
{
	char path[REGISTRY_PATH_MAX];

	if (registry_entry_path(path, sub, name) == 0)
		unlinkat(dirfd, path, 0);
}

/* Take back a file just created: remove @path, close @fd; -1, errno kept. */
static int uncreate(int dirfd, const char *path, int fd)
{
	int e = errno;

	unlinkat(dirfd, path, 0);
	close(fd);
	errno = e;
	return -1;
}

/* Create @path (it must not exist yet), writable by us only, and lock it. */
static int create_locked(int dirfd, const char *path, struct flock *fl)
{
	int fd = openat(dirfd, path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0)
		return -1;
	fchmod(fd, file_mode & ~(mode_t)022);   /* others read them, only we write */
	return fcntl(fd, F_OFD_SETLK, fl) == 0 ? fd : uncreate(dirfd, path, fd);
}

/*
 * Make @path locked from its first moment: under a temporary name
 * (".new.<random>", which registry_gc leaves alone), locked, then renamed.
 * Between a plain create and its lock, anyone tidying the registry
 * (registry_gc, a client looking for listeners, a process folding dead
 * tables) takes the entry for a dead owner's and removes it: a listener
 * clients never find, a table `smclo stat` never lists.  -1 (errno) on
 * failure; EINVAL: the filesystem cannot rename without replacing.
 */
static int create_locked_renamed(int dirfd, const char *sub, const char *path,
                                 struct flock *fl)
{
	char tmp[REGISTRY_PATH_MAX], name[40];
	int fd;

	snprintf(name, sizeof(name), ".new.%016llx", (unsigned long long)registry_random64());
	if (registry_entry_path(tmp, sub, name) < 0 || (fd = create_locked(dirfd, tmp, fl)) < 0)
		return -1;
	if (renameat2(dirfd, tmp, dirfd, path, RENAME_NOREPLACE) == 0)
		return fd;
	return uncreate(dirfd, tmp, fd);
}

int registry_lock_create(int dirfd, const char *sub, const char *name)
{
	char path[REGISTRY_PATH_MAX];
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	int fd;

	if (registry_entry_path(path, sub, name) < 0)
		return -1;
	fd = create_locked_renamed(dirfd, sub, path, &fl);
	if (fd < 0 && errno == EINVAL)
		fd = create_locked(dirfd, path, &fl);   /* with the window, then */
	if (fd < 0)
		return -1;
	if (fd <= 2) {
		/* held for the process's life: never as a closed stdin, stdout or
		 * stderr, where the program's writes would land in it (the lock
		 * belongs to the open file, and goes along) */
		int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		close(fd);
		fd = high;
	}
	return fd;
}

void registry_lock_remove(int dirfd, const char *sub, int lock)
{
	char link[64], target[PATH_MAX], path[REGISTRY_PATH_MAX];
	struct stat mine, there;
	const char *name;
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", lock);
	n = readlink(link, target, sizeof(target) - 1);
	if (n > 0) {
		target[n] = '\0';
		name = strrchr(target, '/');
		/* only the very file we hold: not one that took its name meanwhile */
		if (name && registry_entry_path(path, sub, name + 1) == 0 &&
		    fstat(lock, &mine) == 0 && fstatat(dirfd, path, &there, AT_SYMLINK_NOFOLLOW) == 0 &&
		    mine.st_ino == there.st_ino && mine.st_dev == there.st_dev)
			unlinkat(dirfd, path, 0);
	}
	sys_close(lock);        /* smclo's own (hidden): not through close(), which keeps those */
}

/* 1 if locked, 0 if not, -1 if gone; *@owner (if given) the file's owner. */
static int entry_locked(int dirfd, const char *sub, const char *name, uid_t *owner)
{
	char path[REGISTRY_PATH_MAX];
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	struct stat st;
	int fd;

	if (registry_entry_path(path, sub, name) < 0)
		return -1;      /* no such entry can exist */
	fd = registry_open_read(dirfd, path);
	if (fd < 0 && (owner || errno == EPERM))
		return -1;      /* whose it is cannot be told, or no entry at all: as if gone */
	if (fd < 0)
		return errno == ENOENT ? -1 : 1;   /* unreadable: assume alive, never remove it */
	if (owner)
		*owner = fstat(fd, &st) == 0 ? st.st_uid : (uid_t)-1;
	if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
		fl.l_type = F_UNLCK;
	close(fd);
	return fl.l_type != F_UNLCK;
}

int registry_is_locked(int dirfd, const char *sub, const char *name)
{
	return entry_locked(dirfd, sub, name, NULL);
}

uint64_t registry_random64(void)
{
	uint64_t v = 0;

	if (syscall(SYS_getrandom, &v, sizeof(v), 0) != sizeof(v))
		v = (uint64_t)sys_getpid() << 32 ^ (uint64_t)time(NULL);
	return v;
}

int registry_listener_add(int dirfd, const struct ep *addr, uint64_t netns, unsigned flags,
                          const struct listener_offer *offer)
{
	char name[200], ip[33];
	struct listener_offer none = { 0 };
	int lock;

	if (!offer)
		offer = &none;
	ep_ip_hex(addr, ip);
	snprintf(name, sizeof(name), "%u.%016llx.%s.%u.%d.%016llx.%016llx.%u.%u.%08llx",
	         addr->port, (unsigned long long)netns, ip, flags,
	         offer->inbox_pid ? offer->inbox_pid : (int)sys_getpid(),
	         (unsigned long long)offer->inbox, (unsigned long long)offer->direct,
	         offer->tx_size, offer->rx_max,
	         (unsigned long long)(registry_random64() & 0xffffffffu));
	lock = registry_lock_create(dirfd, "l", name);
	if (lock >= 0)
		listeners_count(dirfd);         /* after the entry exists: see registry_port_unlistened */
	return lock;
}

struct listener_name {
	unsigned port, flags;
	unsigned long long netns;
	struct ep ip;
	int pid;
	struct listener_offer offer;
};

static int parse_listener_name(const char *n, struct listener_name *out)
{
	char ip[33];
	unsigned long long rnd, inbox, direct;

	if (sscanf(n, "%u.%16llx.%32[0-9a-f].%u.%d.%16llx.%16llx.%u.%u.%llx", &out->port,
	           &out->netns, ip, &out->flags, &out->pid, &inbox, &direct,
	           &out->offer.tx_size, &out->offer.rx_max, &rnd) != 10 || strlen(ip) != 32)
		return -1;
	out->offer.inbox = inbox;
	out->offer.direct = direct;
	return ep_ip_from_hex(&out->ip, ip);
}


struct find_state {
	const struct ep *dst;
	uint64_t my_netns;
	struct listener_info *info;
	int inboxes_seen;       /* live same-namespace entries, for exclusivity */
	int untrusted;          /* live entries whose writer could not be vouched for */
	int defers;             /* a live entry for the address says TCP_DEFER_ACCEPT */
	int prefix_ok;          /* ...and every such entry takes first bytes over TCP */
	int listener_uid_known; /* 1: listener_uid from the kernel; -1: none to be had */
	uid_t listener_uid;
};

/* Is the entry still held by its owner (*@owner)?  Removes it if not. */
static int entry_alive(int dirfd, const char *sub, const char *name, uid_t *owner)
{
	int locked = entry_locked(dirfd, sub, name, owner);

	if (locked == 1)
		return 1;
	if (locked == 0)
		registry_entry_remove(dirfd, sub, name);        /* its owner is gone */
	return 0;
}

/*
 * May a client believe an entry @owner wrote?  Root's and a trusted user's,
 * yes; another user's only if the kernel says that user owns the socket
 * listening at the destination in our namespace - anyone may write an
 * entry, and an offer carries the client's first bytes and its socket.
 */
static int entry_trusted(struct find_state *f, uid_t owner, enum listener_match m)
{
	struct ep any = { 0 };

	if (owner == 0 || config_uid_trusted(&cfg, owner))
		return 1;
	if (m != LM_SAME_NETNS || !config_uid_allowed(&cfg, owner))
		return 0;
	if (!f->listener_uid_known) {
		if (ep_is_v4(f->dst))
			any.ip[10] = any.ip[11] = 0xff;
		f->listener_uid_known = peerinfo_tcp_uid(f->dst, &any, &f->listener_uid) == 0 ? 1 : -1;
	}
	return f->listener_uid_known == 1 && f->listener_uid == owner;
}

/*
 * One process accepts on the address when every live entry for it names
 * the same inbox (a fork child or a second listening socket adds an entry
 * of its own).
 */
static void note_inbox(struct find_state *f, const struct listener_name *l, uid_t owner)
{
	struct listener_info *i = f->info;

	if (f->inboxes_seen++ == 0) {
		i->offer = l->offer;
		i->pid = l->pid;
		i->owner = owner;
		i->exclusive = l->offer.inbox != 0;
	} else if (l->offer.inbox != i->offer.inbox || l->pid != i->pid || owner != i->owner) {
		i->exclusive = 0;
	} else if (l->offer.direct != i->offer.direct) {
		i->offer.direct = 0;    /* the listener is changing its mind: use TCP */
	}
}

static enum listener_match match_kind(const struct find_state *f, const struct listener_name *l)
{
	enum listener_match m;

	if (!ep_covers(&l->ip, f->dst, (l->flags & LISTEN_F_V6ONLY) != 0))
		return LM_ELSEWHERE;
	if (l->netns == f->my_netns)
		m = LM_SAME_NETNS;
	else if (ep_is_loopback(f->dst))
		return LM_ELSEWHERE;    /* loopback never leaves our namespace */
	else
		m = LM_OTHER_NETNS;
	return (l->flags & LISTEN_F_UNREACHABLE) ? LM_UNREACHABLE : m;
}

/*
 * TCP_DEFER_ACCEPT belongs to the listening socket, which the processes
 * that accept on it share, so one entry saying so is enough.  The kernel
 * then wakes the acceptor only at the client's first bytes: a client may
 * send them over TCP with its offer to the one process that accepts
 * (info->defers, client.c); to anyone else it stays on TCP at once.
 */
static void listener_defers(struct find_state *f)
{
	struct listener_info *i = f->info;

	if (!f->defers || i->m == LM_UNREACHABLE)
		return;
	if (i->m == LM_SAME_NETNS && i->exclusive && f->prefix_ok) {
		i->defers = 1;
	} else if (i->m > LM_ELSEWHERE) {
		i->m = LM_DEFER;
		i->exclusive = 0;       /* one inbox is no use to a client that takes TCP */
	}
}

static int match_listener(int dirfd, const char *sub, const char *name, void *arg)
{
	struct find_state *f = arg;
	struct listener_name l;
	enum listener_match m;
	uid_t owner;

	if (parse_listener_name(name, &l) < 0 || l.port != f->dst->port)
		return 0;
	m = match_kind(f, &l);
	/* an untrusted entry still says another process accepts here (so the
	 * client will not offer to one inbox), but never that one is there */
	if (m == LM_SAME_NETNS || m == LM_OTHER_NETNS) {
		if (!entry_alive(dirfd, sub, name, &owner))
			return 0;
		if (l.flags & LISTEN_F_DEFER) {
			f->prefix_ok = (f->defers ? f->prefix_ok : 1) && (l.flags & LISTEN_F_PREFIX);
			f->defers = 1;
		}
		if (!entry_trusted(f, owner, m)) {
			f->untrusted++;
			m = LM_UNVERIFIED;
		}
	}
	if (m < f->info->m || (m == f->info->m && m != LM_SAME_NETNS))
		return 0;
	if (m == LM_UNREACHABLE && !entry_alive(dirfd, sub, name, &owner))
		return 0;
	f->info->m = m;
	if (m == LM_SAME_NETNS)
		note_inbox(f, &l, owner);
	return 0;
}

struct listeners_each {
	void (*fn)(const struct registry_listener *, void *);
	void *arg;
};

static int visit_listener(int dirfd, const char *sub, const char *name, void *arg)
{
	struct listeners_each *e = arg;
	struct listener_name l;
	struct registry_listener r;

	if (parse_listener_name(name, &l) < 0 || registry_is_locked(dirfd, sub, name) != 1)
		return 0;
	r = (struct registry_listener){ .addr = l.ip, .flags = l.flags, .pid = l.pid,
	                                .netns = l.netns, .offer = l.offer };
	r.addr.port = (uint16_t)l.port;
	e->fn(&r, e->arg);
	return 0;
}

void registry_listeners_each(int dirfd, void (*fn)(const struct registry_listener *, void *),
                             void *arg)
{
	struct listeners_each e = { fn, arg };

	registry_for_each(dirfd, "l", visit_listener, &e);
}

/*
 * Answers are cached: every connect() would otherwise list l/ and parse
 * every name in it.  An answer holds while l/ has not changed (its mtime
 * moves with every entry added or removed); a positive one for at most
 * LOOKUP_TTL_NS, since a listener that crashed leaves its entry behind
 * until someone collects it.  The mtime comes from a coarse clock, so an
 * answer is only kept when l/ was last changed well before the scan began:
 * a change after the scan then always shows as a newer mtime.
 */
#define LOOKUP_CACHE   8
#define LOOKUP_TTL_NS  1000000000LL
#define LOOKUP_QUIET_NS 50000000LL

struct lookup {
	struct ep dst;
	uint64_t netns;
	struct timespec dir_mtime;
	long long at;
	struct listener_info info;
	int dirfd;
};

static struct lookup lookups[LOOKUP_CACHE];
static unsigned lookup_next;
static pthread_mutex_t lookup_lock = PTHREAD_MUTEX_INITIALIZER;

/* Held across fork() (runtime/fork.c): the child's copy is then free. */
void registry_fork_lock(void)
{
	pthread_mutex_lock(&lookup_lock);
}

void registry_fork_unlock(void)
{
	pthread_mutex_unlock(&lookup_lock);
}

static long long clock_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int lookup_fresh(const struct lookup *l, int dirfd, const struct ep *dst, uint64_t netns,
                        const struct timespec *mtime, long long now)
{
	return l->dirfd == dirfd && l->netns == netns && ep_equal(&l->dst, dst) &&
	       l->dir_mtime.tv_sec == mtime->tv_sec && l->dir_mtime.tv_nsec == mtime->tv_nsec &&
	       (l->info.m == LM_NONE || now - l->at < LOOKUP_TTL_NS);
}

void registry_listener_find(int dirfd, const struct ep *dst, uint64_t my_netns,
                            struct listener_info *info)
{
	struct find_state f = { .dst = dst, .my_netns = my_netns, .info = info };
	long long now = clock_ns(CLOCK_MONOTONIC), scan_start;
	uint64_t added = 0;
	int counted;
	struct stat st;
	int have_mtime = fstatat(dirfd, "l", &st, 0) == 0;

	memset(info, 0, sizeof(*info));
	pthread_mutex_lock(&lookup_lock);
	for (unsigned i = 0; have_mtime && i < LOOKUP_CACHE; i++)
		if (lookup_fresh(&lookups[i], dirfd, dst, my_netns, &st.st_mtim, now)) {
			*info = lookups[i].info;
			pthread_mutex_unlock(&lookup_lock);
			return;
		}
	pthread_mutex_unlock(&lookup_lock);
	scan_start = clock_ns(CLOCK_REALTIME);
	counted = listeners_added(dirfd, &added) == 0;     /* read before the scan */
	/* a registry this process may not read (its owner keeps it to itself)
	 * says nothing about the peer: named as unusable, not as nobody there */
	if (registry_for_each(dirfd, "l", match_listener, &f) == -EACCES)
		info->m = LM_UNREACHABLE;
	if (counted && info->m == LM_NONE)
		port_note_unlistened(dst->port, added);
	if (info->m != LM_SAME_NETNS || f.untrusted)
		info->exclusive = 0;    /* the acceptor may be in another namespace, or another's */
	listener_defers(&f);
	/* our own scan may have removed dead entries: look at l/ again */
	if (have_mtime && fstatat(dirfd, "l", &st, 0) == 0 &&
	    scan_start - (st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec) > LOOKUP_QUIET_NS) {
		pthread_mutex_lock(&lookup_lock);
		lookups[lookup_next++ % LOOKUP_CACHE] = (struct lookup){
			.dst = *dst, .netns = my_netns, .dir_mtime = st.st_mtim, .at = now,
			.info = *info, .dirfd = dirfd };
		pthread_mutex_unlock(&lookup_lock);
	}
}

void registry_rendezvous_key(char *out, size_t len, const struct ep *dst, uint16_t src_port)
{
	char ip[33];

	ep_ip_hex(dst, ip);
	snprintf(out, len, "%u-%u-%s", dst->port, src_port, ip);
}

static int socket_sun(int dirfd, const char *sub, const char *key, struct sockaddr_un *sun)
{
	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	return registry_sun_path(dirfd, sub, key, sun->sun_path, sizeof(sun->sun_path));
}

/* A socket file nobody receives on any more (its owner crashed)? */
static int socket_dead(const struct sockaddr_un *sun)
{
	int fd = sys_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int dead;

	if (fd < 0)
		return 0;
	dead = sys_connect(fd, sun, sizeof(*sun)) < 0 &&
	       errno == ECONNREFUSED;
	sys_close(fd);
	return dead;
}

/* Bind a non-blocking datagram socket at @sub/@key, replacing a dead one. */
static int socket_bind(int dirfd, const char *sub, const char *key)
{
	struct sockaddr_un sun;
	char path[REGISTRY_PATH_MAX];
	int fd, rc;

	if (registry_entry_path(path, sub, key) < 0 || socket_sun(dirfd, sub, key, &sun) < 0)
		return -1;
	fd = sys_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	rc = sys_bind(fd, &sun, sizeof(sun));
	if (rc < 0 && errno == EADDRINUSE && socket_dead(&sun)) {
		unlinkat(dirfd, path, 0);       /* left by a crashed owner */
		rc = sys_bind(fd, &sun, sizeof(sun));
	}
	/* the peer must be able to write to it: same rule as every registry file */
	if (rc == 0 && file_mode != 0600)
		rc = fchmodat(dirfd, path, file_mode, 0);
	if (rc < 0) {
		int e = errno;
		sys_close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/*
 * The registry's shared counters: one page, zero when new, so whoever
 * creates it needs no initialisation step (and no lock): growing an empty
 * file to a page twice is harmless.  The layout is versioned by the name.
 */
struct registry_state {
	_Atomic int64_t rendezvous_bound;
	_Atomic uint64_t offers_sent;
	_Atomic uint64_t listeners_added;
	struct registry_dest dests[REGISTRY_DESTS];
};

_Static_assert(sizeof(struct registry_state) <= 4096, "the shared state is one page");

/*
 * In a registry only its owner can write, the page is the file `state3`,
 * shared by every process.  In one other users write too, anyone of them
 * could truncate it under our feet (SIGBUS), so nothing there is mapped from
 * a file: the page is this process's own, the counts are not kept (servers
 * always look) and what it learns about destinations stays in the process.
 */
static void *state_page_new(int dirfd)
{
	void *p;
	int fd;

	if (registry_is_shared()) {
		p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		return p == MAP_FAILED ? NULL : p;
	}
	fd = registry_open_mappable(dirfd, "state3", dir_owner);
	if (fd < 0)
		return NULL;
	p = registry_map_backed(fd, 4096);
	sys_close(fd);
	return p;
}

static struct registry_state *state_map(int dirfd)
{
	static struct registry_state *_Atomic mapped;
	struct registry_state *st = atomic_load(&mapped);
	void *p;

	if (st)
		return st;
	p = state_page_new(dirfd);
	if (!p)
		return NULL;
	st = NULL;
	if (!atomic_compare_exchange_strong(&mapped, &st, (struct registry_state *)p)) {
		munmap(p, 4096);        /* another thread was first */
		return st;
	}
	return p;
}

int registry_rendezvous_count(int dirfd, int delta)
{
	struct registry_state *st = state_map(dirfd);

	if (!st)
		return -1;
	if (!registry_is_shared())
		atomic_fetch_add(&st->rendezvous_bound, delta);
	return 0;
}

int registry_rendezvous_any(int dirfd)
{
	struct registry_state *st = state_map(dirfd);

	return !st || registry_is_shared() || atomic_load(&st->rendezvous_bound) != 0;
}

int registry_offers_sent(int dirfd, uint64_t *n)
{
	struct registry_state *st = state_map(dirfd);

	if (!st)
		return -1;
	if (registry_is_shared())
		return 1;
	*n = atomic_load(&st->offers_sent);
	return 0;
}

void registry_offer_count(int dirfd)
{
	struct registry_state *st = state_map(dirfd);

	if (st && !registry_is_shared())
		atomic_fetch_add(&st->offers_sent, 1);
}

static int listeners_added(int dirfd, uint64_t *n)
{
	struct registry_state *st = state_map(dirfd);

	if (!st || registry_is_shared())
		return -1;
	*n = atomic_load(&st->listeners_added);
	return 0;
}

static void listeners_count(int dirfd)
{
	struct registry_state *st = state_map(dirfd);

	if (st && !registry_is_shared())
		atomic_fetch_add(&st->listeners_added, 1);
}

/*
 * Ports this process found no listener entry for, each with the count of
 * listeners added when it looked ((count + 1) << 16 | port; 0: nothing).
 * Direct-mapped and lock-free: a lost entry only costs a scan.
 */
#define UNLISTENED_PORTS 64
static _Atomic uint64_t unlistened[UNLISTENED_PORTS];

static void port_note_unlistened(uint16_t port, uint64_t added)
{
	atomic_store_explicit(&unlistened[port % UNLISTENED_PORTS], (added + 1) << 16 | port,
	                      memory_order_relaxed);
}

int registry_port_unlistened(int dirfd, uint16_t port)
{
	uint64_t added;

	return listeners_added(dirfd, &added) == 0 &&
	       atomic_load_explicit(&unlistened[port % UNLISTENED_PORTS], memory_order_relaxed) ==
	       ((added + 1) << 16 | port);
}

struct registry_dest *registry_dests(int dirfd)
{
	struct registry_state *st = state_map(dirfd);

	return st ? st->dests : NULL;
}

int registry_rendezvous_bind(int dirfd, const char *key)
{
	return socket_bind(dirfd, "p", key);
}

int registry_inbox_bind(int dirfd, const char *name)
{
	return socket_bind(dirfd, "i", name);
}

int registry_inbox_connect(int dirfd, const char *name, uid_t *owner)
{
	struct sockaddr_un sun;
	char path[REGISTRY_PATH_MAX];
	struct stat st;
	int fd;

	if (registry_entry_path(path, "i", name) < 0 ||
	    fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode) ||
	    socket_sun(dirfd, "i", name, &sun) < 0)
		return -1;
	fd = sys_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (sys_connect(fd, &sun, sizeof(sun)) < 0) {
		sys_close(fd);
		return -1;
	}
	/* the file may have been replaced between the look and the connect:
	 * the owner counts only if it is still the same file */
	{
		struct stat again;
		if (fstatat(dirfd, path, &again, AT_SYMLINK_NOFOLLOW) < 0 ||
		    again.st_ino != st.st_ino || again.st_dev != st.st_dev) {
			sys_close(fd);
			return -1;
		}
	}
	*owner = st.st_uid;
	return fd;
}

void registry_inbox_remove(int dirfd, const char *name)
{
	registry_entry_remove(dirfd, "i", name);
}

int registry_rendezvous_open(int dirfd, const char *key, uid_t *owner)
{
	char path[REGISTRY_PATH_MAX];
	struct stat st;
	int fd;

	if (registry_entry_path(path, "p", key) < 0)
		return -1;
	fd = openat(dirfd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		sys_close(fd);
		errno = ENOENT;
		return -1;
	}
	*owner = st.st_uid;
	return fd;
}

ssize_t registry_rendezvous_send(int pathfd, int sock, const struct msghdr *mh)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct msghdr to = *mh;         /* the caller's keeps no pointer to sun */

	/* through the descriptor: exactly the socket whose owner was checked */
	snprintf(sun.sun_path, sizeof(sun.sun_path), "/proc/self/fd/%d", pathfd);
	to.msg_name = &sun;
	to.msg_namelen = sizeof(sun);
	return sys_sendmsg(sock, &to, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void registry_rendezvous_remove(int dirfd, const char *key)
{
	registry_entry_remove(dirfd, "p", key);
}

int registry_sun_path(int dirfd, const char *sub, const char *name, char *out, size_t len)
{
	int n = snprintf(out, len, "/proc/self/fd/%d/%s/%s", dirfd, sub, name);

	return (n > 0 && (size_t)n < len) ? 0 : -1;
}

int registry_for_each(int dirfd, const char *sub, registry_visit_fn fn, void *arg)
{
	int fd = openat(dirfd, sub, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		int e = errno;

		if (fd >= 0)
			close(fd);
		return -e;
	}
	while ((de = readdir(d)) != NULL) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fn(dirfd, sub, de->d_name, arg))
			break;
	}
	closedir(d);
	return 0;
}

/* GC visitor: @arg is the "is this entry dead?" test. */
static int remove_if_dead(int dirfd, const char *sub, const char *name, void *arg)
{
	int (*dead)(int, const char *, const char *) = arg;

	if (name[0] == '.')
		return 0;       /* an entry being made (create_locked_renamed) */
	if (dead(dirfd, sub, name))
		registry_entry_remove(dirfd, sub, name);
	return 0;
}

static void gc_dir(int dirfd, const char *sub, int (*dead)(int, const char *, const char *))
{
	registry_for_each(dirfd, sub, remove_if_dead, (void *)dead);
}

static int lock_dead(int dirfd, const char *sub, const char *name)
{
	return registry_is_locked(dirfd, sub, name) == 0;
}

/* Rendezvous sockets live for a handshake at most. */
static int minute_old(int dirfd, const char *sub, const char *name)
{
	char path[REGISTRY_PATH_MAX];
	struct stat st;

	if (registry_entry_path(path, sub, name) < 0)
		return 0;
	/* a handshake is bounded by seconds; a minute-old file has no owner */
	return fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       time(NULL) - st.st_mtime > 60;
}

/* A parcel (passfd.c) waits for a receiver that may be slow: ten minutes. */
static int parcel_stale(int dirfd, const char *sub, const char *name)
{
	char path[REGISTRY_PATH_MAX];
	struct stat st;

	return registry_entry_path(path, sub, name) == 0 &&
	       fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       time(NULL) - st.st_mtime > 600;
}

static int inbox_dead(int dirfd, const char *sub, const char *name)
{
	struct sockaddr_un sun;

	return socket_sun(dirfd, sub, name, &sun) == 0 && socket_dead(&sun);
}

void registry_gc(int dirfd)
{
	gc_dir(dirfd, "l", lock_dead);
	gc_dir(dirfd, "p", minute_old);
	gc_dir(dirfd, "h", parcel_stale);
	gc_dir(dirfd, "i", inbox_dead);
}

int registry_attach(const char *dir, int is_default, int (*keep)(int fd), char *err,
                    size_t errlen)
{
	int fd = registry_open(dir, is_default, err, errlen);

	if (fd < 0)
		return -1;
	registry_fd = keep(fd);
	return 0;
}

void registry_detach(void)
{
	if (registry_fd >= 0)
		sys_close(registry_fd);         /* the library's own: not through its close() */
	registry_fd = -1;
}
