/*
 * handover.c - connections that outlive an exec (handover.h).
 *
 * The record of one connection, in SMCLO_HANDOVER (records separated by
 * ';', fields by ','):
 *
 *   ino,state_fd,state_offset,region_fd,up,down,mine,direct,tcp_fd,domain,
 *   local_ip_hex,local_port,peer_ip_hex,peer_port,pool_fd,pool_wake_fd
 *
 * (pool_fd and pool_wake_fd: the peer's buffer pool this process mapped,
 * and its wake-up socket; -1 when there is none.)
 *
 * ino is the doorbell socket's inode: the new program binds every inherited
 * descriptor of that socket, whatever its number.  Everything else is
 * checked again on arrival (a sealed memfd of the right size, a socket),
 * like anything a peer sends: the environment is the caller's to change.
 *
 * The exec side runs where malloc must not (a vfork child shares the
 * parent's heap and locks): it formats into the caller's buffers and reads
 * its descriptors with getdents64 on /proc/self/fd.
 */
#include "handover.h"
#include "fdtab.h"

#include "elfinfo.h"

#include "conn.h"
#include "handshake.h"
#include "io.h"
#include "log.h"
#include "peerpool.h"
#include "region.h"
#include "sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/xattr.h>
#include <unistd.h>

/* ---- small helpers that neither allocate nor lock ------------------------ */

struct out {
	char *p, *end;
};

static void put_str(struct out *o, const char *s)
{
	while (*s && o->p < o->end)
		*o->p++ = *s++;
}

static void put_u64(struct out *o, unsigned long long v)
{
	char tmp[24];
	int n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n && o->p < o->end)
		*o->p++ = tmp[--n];
}

static void put_int(struct out *o, int v)
{
	if (v < 0) {
		put_str(o, "-");
		put_u64(o, (unsigned long long)-(long long)v);
	} else {
		put_u64(o, (unsigned long long)v);
	}
}

/*
 * Call @fn for each open descriptor: /proc/self/fd where it can be read,
 * else every number up to the highest the descriptor table has seen (a
 * chroot without /proc).
 */
static void for_each_open_fd(void (*fn)(int fd, void *arg), void *arg)
{
	char buf[4096];
	int dir = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/fd",
	                       O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dir < 0) {
		for (int fd = 0; fd < 4096; fd++)
			if (sys_fcntl(fd, F_GETFD, 0) >= 0)
				fn(fd, arg);
		return;
	}
	for (;;) {
		long n = syscall(SYS_getdents64, dir, buf, sizeof(buf));
		if (n <= 0)
			break;
		for (long off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(buf + off);
			off += d->d_reclen;
			if (d->d_name[0] >= '0' && d->d_name[0] <= '9') {
				int fd = atoi(d->d_name);
				if (fd != dir)
					fn(fd, arg);
			}
		}
	}
	sys_close(dir);
}

static unsigned long socket_ino(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? (unsigned long)st.st_ino : 0;
}

/* The accelerated connection whose doorbell socket has inode @ino, or NULL. */
struct find_ino {
	unsigned long ino;
	struct conn *found;
};

static void match_ino(int fd, struct conn *c, void *arg)
{
	struct find_ino *f = arg;

	if (!f->found && c->mode == MODE_SHM && c->bell_ino == f->ino)
		f->found = c;
}

static struct conn *conn_by_ino(int fd, unsigned long ino)
{
	struct fd_entry *e = fd_entry(fd);
	struct conn *c = e ? atomic_load(&e->conn) : NULL;
	struct find_ino f = { .ino = ino };

	if (c && c->mode == MODE_SHM && c->bell_ino == ino)
		return c;       /* where it was: the usual case */
	fd_for_each_conn(match_ino, &f);
	return f.found;
}

/* ---- will the new program load smclo? ------------------------------------ */

/* Does @envp say SMCLO_DISABLE=1 (the new program's smclo would do nothing)? */
static int env_disables(char *const envp[])
{
	for (int i = 0; envp && envp[i]; i++)
		if (!strncmp(envp[i], "SMCLO_DISABLE=1", 15))
			return 1;
	return 0;
}

static int env_has_our_preload(char *const envp[])
{
	for (int i = 0; envp && envp[i]; i++)
		if (!strncmp(envp[i], "LD_PRELOAD=", 11) && strstr(envp[i], "libsmclo"))
			return 1;
	return 0;
}

/*
 * Will smclo see this program's socket calls?  Its loader must run (a
 * dynamically linked ELF of our class), and it must not be a Go program:
 * Go's runtime reads and writes descriptors with raw system calls, so a
 * connection taken over there would be read as the doorbell socket it is
 * underneath - wrong bytes.  Such a program gets a reset, as one without
 * smclo does.  It loads smclo through LD_PRELOAD (@preload) or because it
 * was linked with -lsmclo (DT_NEEDED).
 */
static int elf_loads_smclo(int fd, int preload)
{
	struct elf_facts f;

	return elf_facts_fd(fd, &f) == 0 && f.interp && f.is64 && !f.go &&
	       (!ELF_MACHINE_NATIVE || f.machine == ELF_MACHINE_NATIVE) &&
	       (preload || f.needs_smclo);
}

int handover_target_loads_smclo(const char *path, char *const envp[])
{
	char head[2];
	struct stat st;
	int fd, ok = 0, preload;

	/* what the kernel will refuse to run: the exec fails, nothing changes */
	if (!path || stat(path, &st) < 0 || !S_ISREG(st.st_mode) ||
	    faccessat(AT_FDCWD, path, X_OK, AT_EACCESS) < 0)
		return -1;
	if (env_disables(envp))
		return 0;
	preload = env_has_our_preload(envp);
	/* O_NONBLOCK: a path swapped for a FIFO since the stat must not block us */
	fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return 0;
	/* the loader ignores LD_PRELOAD for set-ID and file-capability programs
	 * (and finds libraries differently there: not trusted for -lsmclo) */
	if (fstat(fd, &st) == 0 && !(st.st_mode & (S_ISUID | S_ISGID)) &&
	    fgetxattr(fd, "security.capability", NULL, 0) < 0 &&
	    pread(fd, head, 2, 0) == 2)
		ok = (head[0] == '#' && head[1] == '!') ? preload : elf_loads_smclo(fd, preload);
	sys_close(fd);
	return ok;
}

/* ---- the exec side -------------------------------------------------------- */

struct exec_scan {
	int loads_smclo;
	int vfork_child;
	struct out rec;
	int n;
	struct conn *done[HANDOVER_MAX];
	int n_reset;
	struct conn *reset[HANDOVER_MAX];       /* counted once, whatever its descriptors */
	int n_left;
	struct conn *left[HANDOVER_MAX];        /* left behind at the exec (close-on-exec) */
	struct handover_undo *undo;
};

static int in(struct conn *const *set, int n, const struct conn *c)
{
	for (int i = 0; i < n; i++)
		if (set[i] == c)
			return 1;
	return 0;
}

/* Make @fd survive the exec; returns the number the new program sees. */
static int keep_across(struct exec_scan *x, int fd)
{
	struct handover_undo *u = x->undo;
	int fl;

	if (fd < 0)
		return -1;
	fl = sys_fcntl(fd, F_GETFD, 0);
	if (fl < 0 && x->vfork_child) {
		/*
		 * The child closed every descriptor above 2 before exec, as
		 * subprocess does: the parent, waiting for us, still has it.
		 */
		char path[64];
		struct out o = { path, path + sizeof(path) - 1 };
		put_str(&o, "/proc/");
		put_u64(&o, (unsigned long long)sys_getpid());
		put_str(&o, "/fd/");
		put_u64(&o, (unsigned long long)fd);
		*o.p = '\0';
		fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDWR);
		if (fd >= 0 && fd <= 2) {       /* not where the program's stdio is */
			int high = sys_fcntl(fd, F_DUPFD, 3);
			sys_close(fd);
			fd = high;
		}
		return fd;
	}
	if (fl < 0)
		return -1;
	if (fl & FD_CLOEXEC) {
		for (int i = 0; i < u->n_cleared; i++)
			if (u->cloexec_cleared[i] == fd)
				return fd;
		if (u->n_cleared == (int)(sizeof(u->cloexec_cleared) / sizeof(int)))
			return -1;
		sys_fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC);
		u->cloexec_cleared[u->n_cleared++] = fd;
	}
	return fd;
}

static void put_ep(struct out *o, const struct ep *e)
{
	char hex[33];

	ep_ip_hex(e, hex);
	put_str(o, hex);
	put_str(o, ",");
	put_u64(o, e->port);
}

static void put_record(struct out *o, const struct conn *c, uint32_t off,
                       const struct handover_fds *fds)
{
	put_u64(o, c->bell_ino);                        put_str(o, ",");
	put_int(o, fds->sh);                            put_str(o, ",");
	put_u64(o, off);                                put_str(o, ",");
	put_int(o, fds->region);                        put_str(o, ",");
	put_u64(o, region_mine(c->region) ? c->tx_size : c->rx_size);     put_str(o, ",");
	put_u64(o, region_mine(c->region) ? c->rx_size : c->tx_size);     put_str(o, ",");
	put_u64(o, (unsigned)region_mine(c->region));   put_str(o, ",");
	put_u64(o, (unsigned)c->direct);                put_str(o, ",");
	put_int(o, fds->tcp);                           put_str(o, ",");
	put_int(o, c->domain);                          put_str(o, ",");
	put_ep(o, &c->local);                           put_str(o, ",");
	put_ep(o, &c->peer);                            put_str(o, ",");
	put_int(o, fds->pool);                          put_str(o, ",");
	put_int(o, fds->pool_wake);
}

int handover_format(char *buf, size_t len, const struct conn *c, unsigned off,
                    const struct handover_fds *fds)
{
	struct out o = { buf, buf + len - 1 };

	put_record(&o, c, off, fds);
	if (o.p == o.end)
		return -1;
	*o.p = '\0';
	return (int)(o.p - buf);
}

/* Append the record of @c; 0 if written. */
static int record(struct exec_scan *x, struct conn *c)
{
	struct handover_fds fds = { .sh = -1, .pool = -1, .pool_wake = -1 };
	uint32_t off = 0;
	struct out o = x->rec;

	fds.region = c->region ? region_memfd(c->region) : -1;
	if (!x->loads_smclo || x->n == HANDOVER_MAX || fds.region < 0 ||
	    shared_locate(c->sh, &fds.sh, &off) < 0)
		return -1;
	if (x->rec.p + 220 > x->rec.end)
		return -1;
	fds.sh = keep_across(x, fds.sh);
	fds.region = keep_across(x, fds.region);
	if (fds.sh < 0 || fds.region < 0)
		return -1;
	fds.tcp = keep_across(x, c->tcp_fd);
	if (c->rx_pool) {
		/* the new program maps the peer's pool again: references the
		 * peer sent, read or not yet, stay readable */
		fds.pool = keep_across(x, c->rx_pool_fd);
		fds.pool_wake = keep_across(x, c->pool_wake_fd);
	}
	if (x->n)
		put_str(&o, ";");
	put_record(&o, c, off, &fds);
	x->rec = o;
	return 0;
}

static void count_reset(void)
{
	if (totals)
		atomic_fetch_add(&totals->fallback[R_EXEC_NO_SMCLO], 1);
}

static void scan_one(int fd, void *arg)
{
	struct exec_scan *x = arg;
	unsigned long ino;
	struct conn *c;
	int fl = sys_fcntl(fd, F_GETFD, 0);

	if (fl < 0 || (fl & FD_CLOEXEC) || fd == registry_fd || !(ino = socket_ino(fd)))
		return;
	if (!(c = conn_by_ino(fd, ino)))
		return;         /* a TCP connection is the real socket: the program may use it */
	if (in(x->done, x->n, c))
		return;         /* recorded through another descriptor (0 and 1) */
	if (atomic_load(&c->pending) == PENDING_NONE && record(x, c) == 0) {
		x->done[x->n++] = c;
		if (x->vfork_child) {
			/* the new program holds it beside the parent */
			atomic_fetch_add(&c->sh->holders, 1);
			x->undo->counted[x->undo->n_counted++] = c->sh;
		}
		return;
	}
	/* not a vfork child: its moves would be its parent's, whose
	 * descriptors still name the doorbell */
	if (!x->vfork_child && !in(x->reset, x->n_reset, c) && hs_hand_on_tcp(fd, c) == 0) {
		DBG("exec: fd %d goes on over TCP (handed-on)", fd);
		return;         /* the descriptor is the TCP socket now */
	}
	if (!in(x->reset, x->n_reset, c)) {
		count_reset();
		if (x->n_reset < HANDOVER_MAX)
			x->reset[x->n_reset++] = c;
	}
	hs_release_for_exec(fd, !x->vfork_child);
}

/*
 * A connection whose every descriptor is close-on-exec: the kernel closes
 * them at the exec without a word to us, so this process says now that it
 * no longer holds it (a forked child that execs would otherwise hold its
 * parent's connections for ever: no CLOSED, no reset when the last goes).
 */
static void leave_closed_at_exec(int fd, struct conn *c, void *arg)
{
	struct exec_scan *x = arg;
	struct handover_undo *u = x->undo;

	if (c->mode != MODE_SHM || in(x->done, x->n, c) || in(x->reset, x->n_reset, c) ||
	    in(x->left, x->n_left, c) || x->n_left == HANDOVER_MAX)
		return;
	x->left[x->n_left++] = c;
	if (close_leave_at_exec(c) && u->n_left < HANDOVER_MAX)
		u->left[u->n_left++] = c->sh;
}

static char *const *env_with(char *const envp[], const char *entry, char **out, size_t cap)
{
	size_t n = 0;

	for (int i = 0; envp && envp[i]; i++) {
		if (!strncmp(envp[i], HANDOVER_ENV "=", sizeof(HANDOVER_ENV)))
			continue;       /* a stale one of ours */
		if (n + 2 >= cap)
			return envp;
		out[n++] = envp[i];
	}
	out[n++] = (char *)entry;
	out[n] = NULL;
	return out;
}

char *const *handover_exec(char *const envp[], int loads_smclo, char **out, size_t cap,
                           char *buf, size_t buflen, struct handover_undo *undo)
{
	struct exec_scan x = { .loads_smclo = loads_smclo, .undo = undo };

	memset(undo, 0, sizeof(*undo));
	if (!smclo_active || conn_count() == 0)
		return envp;
	x.vfork_child = sys_in_vfork_child();
	if (!x.vfork_child)
		hs_resolve_all();       /* an undecided connection becomes one or the other */
	x.rec.p = buf;
	x.rec.end = buf + buflen - 1;
	put_str(&x.rec, HANDOVER_ENV "=");
	for_each_open_fd(scan_one, &x);
	if (!x.vfork_child)
		fd_for_each_conn(leave_closed_at_exec, &x);
	if (!x.n)
		return envp;
	*x.rec.p = '\0';
	DBG("exec: %d connection(s) handed over", x.n);
	return env_with(envp, buf, out, cap);
}

void handover_undo(struct handover_undo *undo)
{
	for (int i = 0; i < undo->n_cleared; i++)
		sys_fcntl(undo->cloexec_cleared[i], F_SETFD, FD_CLOEXEC);
	for (int i = 0; i < undo->n_counted; i++)
		atomic_fetch_sub(&undo->counted[i]->holders, 1);
	for (int i = 0; i < undo->n_left; i++)
		atomic_fetch_add(&undo->left[i]->holders, 1);
	memset(undo, 0, sizeof(*undo));
}

/* ---- the new program's side ----------------------------------------------- */

struct record {
	unsigned long ino;
	struct handover_fds fds;
	int domain;
	uint32_t sh_off, up, down;
	int mine, direct;
	struct ep local, peer;
};

static int parse_num(const char **s, long long lo, long long hi, long long *v)
{
	char *end;

	errno = 0;
	*v = strtoll(*s, &end, 10);
	if (errno || end == *s || *v < lo || *v > hi || (*end != ',' && *end != ';' && *end))
		return -1;
	*s = *end ? end + 1 : end;
	return 0;
}

static int parse_ep(const char **s, struct ep *e)
{
	char hex[33];
	long long port;

	if (strlen(*s) < 33 || (*s)[32] != ',')
		return -1;
	memcpy(hex, *s, 32);
	hex[32] = '\0';
	if (ep_ip_from_hex(e, hex) < 0)
		return -1;
	*s += 33;
	if (parse_num(s, 0, 65535, &port) < 0)
		return -1;
	e->port = (uint16_t)port;
	return 0;
}

static int parse_record(const char **s, struct record *r)
{
	long long v[10], pool[2];
	static const long long lo[10] = { 1, -1, 0, -1, 1, 1, 0, 0, -1, 0 };
	static const long long hi[10] = { 1LL << 62, 1 << 24, 1 << 20, 1 << 24, 1 << 30,
	                                  1 << 30, 1, 1, 1 << 24, 1 << 16 };

	for (int i = 0; i < 10; i++)
		if (parse_num(s, lo[i], hi[i], &v[i]) < 0)
			return -1;
	if (parse_ep(s, &r->local) < 0 || parse_ep(s, &r->peer) < 0 ||
	    parse_num(s, -1, 1 << 24, &pool[0]) < 0 || parse_num(s, -1, 1 << 24, &pool[1]) < 0)
		return -1;
	r->ino = (unsigned long)v[0];
	r->fds.sh = (int)v[1];
	r->sh_off = (uint32_t)v[2];
	r->fds.region = (int)v[3];
	r->up = (uint32_t)v[4];
	r->down = (uint32_t)v[5];
	r->mine = (int)v[6];
	r->direct = (int)v[7];
	r->fds.tcp = (int)v[8];
	r->domain = (int)v[9];
	r->fds.pool = (int)pool[0];
	r->fds.pool_wake = (int)pool[1];
	return 0;
}

/*
 * glibc's stdio reads and writes through internal entries no preload
 * library sees: a program that reads its handed-over stdin with fgets()
 * would read the doorbells (end of file), one that printf()s would write
 * raw bytes on the doorbell socket.  So stdin, stdout and stderr, when
 * they are a connection taken over, become streams whose reads and writes
 * come through smclo's own read() and write().
 */
static ssize_t stream_read(void *cookie, char *buf, size_t n)
{
	return read((int)(intptr_t)cookie, buf, n);
}

static ssize_t stream_write(void *cookie, const char *buf, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t w = write((int)(intptr_t)cookie, buf + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return done ? (ssize_t)done : -1;
		done += (size_t)w;
	}
	return (ssize_t)done;
}

static int stream_close(void *cookie)
{
	return close((int)(intptr_t)cookie);
}

static void stdio_through_smclo(int fd)
{
	cookie_io_functions_t io = { .read = stream_read, .write = stream_write,
	                             .close = stream_close };
	FILE *f = fopencookie((void *)(intptr_t)fd, fd == 0 ? "r" : "w", io);

	if (!f)
		return;
	if (fd == 0)
		stdin = f;
	else if (fd == 1)
		stdout = f;
	else {
		setvbuf(f, NULL, _IONBF, 0);
		stderr = f;
	}
}

struct adopt {
	struct record *r;
	struct conn *c;         /* NULL: its state did not arrive */
	int found;
};

static void adopt_fd(int fd, void *arg)
{
	struct adopt *a = arg;

	const struct handover_fds *f = &a->r->fds;

	if (fd == f->sh || fd == f->region || fd == f->tcp || fd == f->pool || fd == f->pool_wake ||
	    socket_ino(fd) != a->r->ino)
		return;
	a->found++;
	if (a->c) {
		fd_bind_conn(a->c, fd);
		if (fd <= 2)
			stdio_through_smclo(fd);
		return;
	}
	if (totals)
		atomic_fetch_add(&totals->fallback[R_HANDOVER_LOST], 1);
	hs_release_for_exec(fd, 0);
}

static struct conn *conn_from_record(const struct record *r, struct conn_shared *sh,
                                     struct region *region)
{
	struct conn *c = conn_alloc(MODE_SHM);
	int type = 0;
	socklen_t l = sizeof(type);

	if (!c)
		return NULL;
	c->region = region;
	c->sh = sh;
	c->tx = r->mine ? region_up(region) : region_down(region);
	c->rx = r->mine ? region_down(region) : region_up(region);
	c->tx_size = r->mine ? r->up : r->down;
	c->rx_size = r->mine ? r->down : r->up;
	c->direct = r->direct;
	c->domain = r->domain;
	c->local = r->local;
	c->peer = r->peer;
	c->bell_ino = r->ino;
	c->inherited = 1;
	if (r->fds.tcp >= 0 && sys_getsockopt(r->fds.tcp, SOL_SOCKET, SO_TYPE, &type, &l) == 0 &&
	    type == SOCK_STREAM)
		c->tcp_fd = fd_hide(r->fds.tcp);
	else
		c->direct = 1;  /* no TCP socket came along: answer as a direct one does */
	c->slot = stats_slot_alloc(stats_table(registry_fd, NULL, 0), -1, r->mine ? ROLE_CLIENT : ROLE_SERVER);
	if (c->slot) {
		c->slot->local = r->local;
		c->slot->peer = r->peer;
		c->slot->tx_ring = c->tx_size;
		c->slot->rx_ring = c->rx_size;
	}
	stats_slot_decide(NULL, c->slot, MODE_SHM, R_NONE);     /* counted when it was made */
	return c;
}

/* Take over the connection of @r; 0 if it is ours now. */
static int adopt_one(struct record *r)
{
	struct adopt a = { .r = r };
	struct conn_shared *sh = NULL;
	struct region *region = NULL;

	if (r->fds.sh >= 0)
		sh = shared_adopt(r->fds.sh, r->sh_off);
	if (sh && r->fds.region >= 0 && smclo_active)
		region = region_adopt(r->fds.region, r->up, r->down, r->mine);
	if (sh && region)
		a.c = conn_from_record(r, sh, region);
	/* without its pool, a reference into it resets the connection */
	if (a.c && r->fds.pool >= 0 && peerpool_inherit(a.c, r->fds.pool, r->fds.pool_wake) < 0)
		DBG("a connection taken over lost its peer's pool");
	for_each_open_fd(adopt_fd, &a);
	if (a.c) {
		DBG("took over a connection on %d descriptor(s)", a.found);
		a.c->reusable = 0;
		if (!a.found)
			atomic_fetch_sub(&sh->holders, 1);      /* it did not reach us */
		conn_put(a.c);  /* the descriptors hold it now, or nobody does */
		return a.found ? 0 : -1;
	}
	/* could not take it over: we do not hold it any more */
	if (sh)
		atomic_fetch_sub(&sh->holders, 1);
	if (region)
		region_put(region, 0);
	if (sh)
		shared_put(sh, 0);
	return -1;
}

int handover_take(const char *record, const struct handover_fds *fds)
{
	struct record r;
	const char *s = record;

	if (parse_record(&s, &r) < 0)
		return -1;
	r.fds = *fds;   /* the descriptors came with the message */
	return adopt_one(&r);
}

void handover_adopt(void)
{
	const char *env = getenv(HANDOVER_ENV), *s;
	struct record recs[HANDOVER_MAX];
	int n = 0;

	if (!env || !fdtab)
		return;
	for (s = env; *s && n < HANDOVER_MAX;) {
		if (parse_record(&s, &recs[n]) < 0) {
			fprintf(stderr, "smclo: %s is malformed; connections handed over are reset\n",
			        HANDOVER_ENV);
			break;
		}
		n++;
	}
	for (int i = 0; i < n; i++)
		adopt_one(&recs[i]);
	/* the descriptors of the state: what we keep, we keep hidden (a copy) */
	for (int i = 0; i < n; i++) {
		const struct handover_fds *f = &recs[i].fds;

		if (f->sh > 2)
			sys_close(f->sh);
		if (f->region > 2)
			sys_close(f->region);
		if (f->pool > 2)
			sys_close(f->pool);     /* peerpool_inherit kept copies */
		if (f->pool_wake > 2)
			sys_close(f->pool_wake);
	}
	unsetenv(HANDOVER_ENV);
}
