/*
 * spawn.c - posix_spawn, posix_spawnp, system and popen, for a process
 * that holds accelerated connections.
 *
 * glibc starts these programs from a clone of its own that execs through an
 * internal execve, where the handover (handover.h) cannot run: the new
 * program would get a doorbell socket and read it as end-of-file.  So while
 * this process holds an accelerated connection they are done here, as
 * glibc does them but with our exec: vfork, apply the attributes and file
 * actions, then exec through exec_with_handover(), the error coming back
 * through the memory the vfork child shares.  A process without
 * accelerated connections gets glibc's own.
 *
 * File actions are opaque in glibc, so the posix_spawn_file_actions_*
 * calls are interposed to keep a copy of each list; a list made some other
 * way (copied bytes) is not known, and such a spawn goes to glibc.
 */
#include "conn.h"
#include "exec.h"
#include "fdtab.h"
#include "handshake.h"
#include "interpose.h"
#include "shim.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum fa_kind { FA_OPEN, FA_CLOSE, FA_DUP2, FA_CHDIR, FA_FCHDIR, FA_CLOSEFROM };

struct fa_op {
	enum fa_kind kind;
	int fd, newfd, oflag;
	mode_t mode;
	char *path;
};

/* Our copy of one posix_spawn_file_actions_t, keyed by its address. */
struct fa_list {
	struct fa_list *next;
	const void *key;
	struct fa_op *ops;
	int n, cap;
	int unknown;            /* an action we cannot replay was added */
};

static pthread_mutex_t fa_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fa_list *fa_lists;

/* Held across fork() (runtime/fork.c): the child's copy is then free. */
void spawn_fork_lock(void)
{
	pthread_mutex_lock(&fa_lock);
}

void spawn_fork_unlock(void)
{
	pthread_mutex_unlock(&fa_lock);
}

/* With fa_lock held. */
static struct fa_list *fa_find(const void *key, int create)
{
	struct fa_list *l;

	for (l = fa_lists; l; l = l->next)
		if (l->key == key)
			return l;
	if (!create || !(l = calloc(1, sizeof(*l))))
		return NULL;
	l->key = key;
	l->next = fa_lists;
	fa_lists = l;
	return l;
}

static void fa_free_ops(struct fa_list *l)
{
	for (int i = 0; i < l->n; i++)
		free(l->ops[i].path);
	free(l->ops);
	l->ops = NULL;
	l->n = l->cap = 0;
}

static void fa_forget(const void *key)
{
	pthread_mutex_lock(&fa_lock);
	for (struct fa_list **pp = &fa_lists; *pp; pp = &(*pp)->next)
		if ((*pp)->key == key) {
			struct fa_list *l = *pp;
			*pp = l->next;
			fa_free_ops(l);
			free(l);
			break;
		}
	pthread_mutex_unlock(&fa_lock);
}

/* Record @op for @key once libc accepted it (@rc 0). */
static int fa_add(const void *key, int rc, struct fa_op op)
{
	struct fa_list *l;

	if (rc != 0)
		return rc;
	pthread_mutex_lock(&fa_lock);
	l = fa_find(key, 1);
	if (l && l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 8;
		struct fa_op *ops = realloc(l->ops, (size_t)cap * sizeof(*ops));
		if (ops) {
			l->ops = ops;
			l->cap = cap;
		}
	}
	if (l && l->n < l->cap && (!op.path || (op.path = strdup(op.path))))
		l->ops[l->n++] = op;
	else if (l)
		l->unknown = 1;
	pthread_mutex_unlock(&fa_lock);
	return rc;
}

EXPORT int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa)
{
	REAL(posix_spawn_file_actions_init);

	fa_forget(fa);          /* a list reinitialised without destroy */
	return real_posix_spawn_file_actions_init(fa);
}

EXPORT int posix_spawn_file_actions_destroy(posix_spawn_file_actions_t *fa)
{
	REAL(posix_spawn_file_actions_destroy);

	fa_forget(fa);
	return real_posix_spawn_file_actions_destroy(fa);
}

EXPORT int posix_spawn_file_actions_addopen(posix_spawn_file_actions_t *fa, int fd,
                                            const char *path, int oflag, mode_t mode)
{
	REAL(posix_spawn_file_actions_addopen);

	return fa_add(fa, real_posix_spawn_file_actions_addopen(fa, fd, path, oflag, mode),
	              (struct fa_op){ FA_OPEN, fd, 0, oflag, mode, (char *)path });
}

EXPORT int posix_spawn_file_actions_addclose(posix_spawn_file_actions_t *fa, int fd)
{
	REAL(posix_spawn_file_actions_addclose);

	return fa_add(fa, real_posix_spawn_file_actions_addclose(fa, fd),
	              (struct fa_op){ .kind = FA_CLOSE, .fd = fd });
}

EXPORT int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa, int fd, int newfd)
{
	REAL(posix_spawn_file_actions_adddup2);

	return fa_add(fa, real_posix_spawn_file_actions_adddup2(fa, fd, newfd),
	              (struct fa_op){ .kind = FA_DUP2, .fd = fd, .newfd = newfd });
}

EXPORT int posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *fa, const char *path)
{
	REAL(posix_spawn_file_actions_addchdir_np);

	return fa_add(fa, real_posix_spawn_file_actions_addchdir_np(fa, path),
	              (struct fa_op){ .kind = FA_CHDIR, .path = (char *)path });
}

EXPORT int posix_spawn_file_actions_addfchdir_np(posix_spawn_file_actions_t *fa, int fd)
{
	REAL(posix_spawn_file_actions_addfchdir_np);

	return fa_add(fa, real_posix_spawn_file_actions_addfchdir_np(fa, fd),
	              (struct fa_op){ .kind = FA_FCHDIR, .fd = fd });
}

EXPORT int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *fa, int from)
{
	REAL(posix_spawn_file_actions_addclosefrom_np);

	return fa_add(fa, real_posix_spawn_file_actions_addclosefrom_np(fa, from),
	              (struct fa_op){ .kind = FA_CLOSEFROM, .fd = from });
}

/* An action we do not replay: the list goes to glibc's posix_spawn. */
EXPORT int posix_spawn_file_actions_addtcsetpgrp_np(posix_spawn_file_actions_t *fa, int tcfd)
{
	REAL(posix_spawn_file_actions_addtcsetpgrp_np);
	int rc = real_posix_spawn_file_actions_addtcsetpgrp_np(fa, tcfd);
	struct fa_list *l;

	if (rc == 0) {
		pthread_mutex_lock(&fa_lock);
		if ((l = fa_find(fa, 1)) != NULL)
			l->unknown = 1;
		pthread_mutex_unlock(&fa_lock);
	}
	return rc;
}

/* ---- in the child --------------------------------------------------------- */

static int apply_op(const struct fa_op *op)
{
	int fd;

	switch (op->kind) {
	case FA_OPEN:
		if ((fd = open(op->path, op->oflag, op->mode)) < 0)
			return errno;
		if (fd != op->fd) {
			if (dup2(fd, op->fd) < 0)
				return errno;
			close(fd);
		}
		return 0;
	case FA_CLOSE:
		close(op->fd);          /* closing what is not open is no error here */
		return 0;
	case FA_DUP2:
		if (op->fd == op->newfd) {      /* POSIX: the copy survives the exec */
			int fl = fcntl(op->fd, F_GETFD);
			return fl < 0 || fcntl(op->fd, F_SETFD, fl & ~FD_CLOEXEC) < 0 ? errno : 0;
		}
		return dup2(op->fd, op->newfd) < 0 ? errno : 0;
	case FA_CHDIR:
		return chdir(op->path) < 0 ? errno : 0;
	case FA_FCHDIR:
		return fchdir(op->fd) < 0 ? errno : 0;
	case FA_CLOSEFROM:
		/* through us: connections leave this process, smclo's own
		 * descriptors stay for the exec's hand-over (handover/handover.c) */
		closefrom(op->fd);
		return 0;
	}
	return EINVAL;
}

/* Signal dispositions and mask as posix_spawn leaves them (glibc's order). */
static int apply_attr(const posix_spawnattr_t *attr, const sigset_t *parent_mask)
{
	short flags = 0;
	sigset_t mask = *parent_mask, def;
	struct sigaction sa = { .sa_handler = SIG_DFL };

	/* no handler of the parent's may run in the child before the exec */
	sigemptyset(&def);
	if (attr) {
		posix_spawnattr_getflags(attr, &flags);
		posix_spawnattr_getsigdefault(attr, &def);
	}
	for (int s = 1; s < NSIG; s++) {
		struct sigaction old;
		if (sigaction(s, NULL, &old) < 0)
			continue;
		if ((flags & POSIX_SPAWN_SETSIGDEF && sigismember(&def, s) == 1) ||
		    (old.sa_handler != SIG_IGN && old.sa_handler != SIG_DFL))
			sigaction(s, &sa, NULL);
	}
	if (flags & POSIX_SPAWN_SETSID && setsid() < 0)
		return errno;
	if (flags & POSIX_SPAWN_SETPGROUP) {
		pid_t pg = 0;
		posix_spawnattr_getpgroup(attr, &pg);
		if (setpgid(0, pg) < 0)
			return errno;
	}
	if (flags & (POSIX_SPAWN_SETSCHEDULER | POSIX_SPAWN_SETSCHEDPARAM)) {
		struct sched_param sp;
		int policy = 0;
		posix_spawnattr_getschedparam(attr, &sp);
		posix_spawnattr_getschedpolicy(attr, &policy);
		if ((flags & POSIX_SPAWN_SETSCHEDULER) ? sched_setscheduler(0, policy, &sp) < 0 :
		    sched_setparam(0, &sp) < 0)
			return errno;
	}
	if (flags & POSIX_SPAWN_RESETIDS && (seteuid(getuid()) < 0 || setegid(getgid()) < 0))
		return errno;
	if (flags & POSIX_SPAWN_SETSIGMASK)
		posix_spawnattr_getsigmask(attr, &mask);
	return pthread_sigmask(SIG_SETMASK, &mask, NULL);
}

struct spawn_req {
	const char *file;
	int search;                             /* posix_spawnp */
	const struct fa_op *ops;
	int nops;
	const posix_spawnattr_t *attr;
	char *const *argv, *const *envp;
};

/* In the vfork child: set up, exec; on failure leave the error in *@report. */
static void child(const struct spawn_req *r, const sigset_t *parent_mask, volatile int *report)
{
	struct exec_call x = { .kind = r->search ? EXEC_SEARCH : EXEC_PATH, .path = r->file,
	                       .argv = r->argv };
	sigset_t all;
	int err;

	sigfillset(&all);
	err = apply_attr(r->attr, parent_mask);
	for (int i = 0; i < r->nops && !err; i++)
		err = apply_op(&r->ops[i]);
	if (!err) {
		exec_with_handover(&x, r->envp);
		err = errno;
		pthread_sigmask(SIG_SETMASK, &all, NULL);
	}
	*report = err ? err : ENOEXEC;
	_exit(127);
}

/*
 * vfork, set up, exec; 0 with *pid, or the error number.  As glibc does
 * it: the parent waits, suspended, until the child has exec'd or failed,
 * and the child's error comes back through memory they share (a pipe
 * would be inherited by a concurrent fork and keep us waiting for that
 * child, or land on 0 or 1 when those are closed).  No fork handler runs:
 * the handover counts the new program as a holder of what it hands over
 * (a vfork child, handover.c), nothing else.  Pending connections are
 * decided first, here: a vfork child may not decide them.
 */
static int spawn_forked(pid_t *pid, const struct spawn_req *r)
{
	volatile int err = 0;
	sigset_t all, old;
	pid_t p;
	int e;

	hs_resolve_all();
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	p = vfork();
	if (p == 0)
		child(r, &old, &err);
	e = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (p < 0)
		return e;
	if (err) {                      /* it did not get to exec: reap it, report */
		while (waitpid(p, NULL, 0) < 0 && errno == EINTR)
			;
		return err;
	}
	if (pid)
		*pid = p;
	return 0;
}

/* Whether to do it here: only while this process holds connections. */
static int ours(void)
{
	return smclo_active && conn_count() > 0;
}

static int spawn_common(pid_t *pid, const char *file, int search,
                        const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                        char *const argv[], char *const envp[], int *handled)
{
	struct spawn_req r = { .file = file, .search = search, .attr = attr, .argv = argv,
	                       .envp = envp };
	struct fa_op *ops = NULL;
	int rc;

	*handled = 0;
	if (!ours())
		return 0;
	if (fa) {
		struct fa_list *l;
		pthread_mutex_lock(&fa_lock);
		l = fa_find(fa, 0);
		if (l && !l->unknown && (ops = malloc((size_t)(l->n ? l->n : 1) * sizeof(*ops)))) {
			memcpy(ops, l->ops, (size_t)l->n * sizeof(*ops));
			r.nops = l->n;
		}
		pthread_mutex_unlock(&fa_lock);
		/* a list we could not copy, or one we never saw that holds
		 * actions (made by copying bytes), is glibc's to run */
		if (!ops && (l || fa->__used > 0))
			return 0;
	}
	r.ops = ops;
	*handled = 1;
	rc = spawn_forked(pid, &r);
	free(ops);              /* the paths stay with the list, which the caller owns */
	return rc;
}

/* The file actions of a spawn, as far as they are known (FA_* ops). */
struct spawn_fds {
	const struct fa_op *ops;
	int nops;
};

/*
 * Does the spawned program keep listener @fd: open without close-on-exec
 * after the file actions, in their order, or copied by one of them (a
 * dup2 to another number leaves the copy without close-on-exec)?
 */
static int spawn_keeps(int fd, const void *ctx)
{
	const struct spawn_fds *s = ctx;
	int kept = !(sys_fcntl(fd, F_GETFD, 0) & FD_CLOEXEC);

	for (int i = 0; i < s->nops; i++) {
		const struct fa_op *op = &s->ops[i];

		if (op->kind == FA_DUP2 && op->fd == fd)
			kept = 1;       /* to itself it clears close-on-exec */
		else if (((op->kind == FA_CLOSE || op->kind == FA_OPEN) && op->fd == fd) ||
		         (op->kind == FA_CLOSEFROM && fd >= op->fd) ||
		         (op->kind == FA_DUP2 && op->newfd == fd))
			kept = 0;       /* closed, or its number given to another file */
		if (op->kind == FA_DUP2 && op->fd == fd && op->newfd != fd)
			return 1;       /* the copy lives on */
	}
	return kept;
}

/*
 * A fork child's listener entries name the inbox it shares with its
 * parent; a program it spawns with one of them would accept connections
 * whose offers wait there for nobody (handshake.h,
 * hs_listeners_before_spawn).  Asked before every spawn, whoever does it.
 */
static void spawn_listeners(const posix_spawn_file_actions_t *fa)
{
	struct spawn_fds s = { 0 };
	struct fa_list *l;

	if (!smclo_active || sys_in_vfork_child())
		return;
	pthread_mutex_lock(&fa_lock);
	if (fa && (l = fa_find(fa, 0)) && !l->unknown) {
		s.ops = l->ops;
		s.nops = l->n;
	}
	hs_listeners_before_spawn(spawn_keeps, &s);
	pthread_mutex_unlock(&fa_lock);
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	REAL(posix_spawn);
	int handled, rc;

	spawn_listeners(fa);
	rc = spawn_common(pid, path, 0, fa, attr, argv, envp, &handled);

	return handled ? rc : real_posix_spawn(pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	REAL(posix_spawnp);
	int handled, rc;

	spawn_listeners(fa);
	rc = spawn_common(pid, file, 1, fa, attr, argv, envp, &handled);

	return handled ? rc : real_posix_spawnp(pid, file, fa, attr, argv, envp);
}

/* ---- system and popen ----------------------------------------------------- */

/* /bin/sh -c @cmd, with @ops; its pid, or -1 with errno. */
static pid_t shell(const char *cmd, const struct fa_op *ops, int nops,
                   const posix_spawnattr_t *attr)
{
	char *argv[] = { "sh", "-c", (char *)cmd, NULL };
	struct spawn_req r = { .file = "/bin/sh", .ops = ops, .nops = nops, .attr = attr,
	                       .argv = argv, .envp = environ };
	pid_t pid;
	int err = spawn_forked(&pid, &r);

	if (err) {
		errno = err;
		return -1;
	}
	return pid;
}

EXPORT int system(const char *cmd)
{
	REAL(system);
	struct sigaction ign = { .sa_handler = SIG_IGN }, old_int, old_quit;
	sigset_t chld, old_mask, def;
	posix_spawnattr_t attr;
	int status = -1;
	pid_t pid;

	if (!cmd || !ours())
		return real_system(cmd);
	/* what POSIX asks of system(): the caller ignores SIGINT and SIGQUIT
	 * and blocks SIGCHLD while the command runs; the command does not */
	sigaction(SIGINT, &ign, &old_int);
	sigaction(SIGQUIT, &ign, &old_quit);
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &old_mask);
	sigemptyset(&def);
	if (old_int.sa_handler != SIG_IGN)
		sigaddset(&def, SIGINT);
	if (old_quit.sa_handler != SIG_IGN)
		sigaddset(&def, SIGQUIT);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setsigdefault(&attr, &def);
	posix_spawnattr_setsigmask(&attr, &old_mask);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
	pid = shell(cmd, NULL, 0, &attr);
	posix_spawnattr_destroy(&attr);
	if (pid < 0)
		status = 127 << 8;      /* as if the shell could not run the command */
	else
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGQUIT, &old_quit, NULL);
	sigprocmask(SIG_SETMASK, &old_mask, NULL);
	return status;
}

/* Streams popen made here, and their commands' pids, for pclose. */
struct popened {
	struct popened *next;
	FILE *f;
	pid_t pid;
};
static struct popened *popened;
static pthread_mutex_t popen_lock = PTHREAD_MUTEX_INITIALIZER;

EXPORT FILE *popen(const char *cmd, const char *mode)
{
	REAL(popen);
	int p[2], reading = mode && mode[0] == 'r', child_end, parent_end;
	struct popened *e;
	struct fa_op op;
	pid_t pid;
	FILE *f;

	if (!ours())
		return real_popen(cmd, mode);
	if (!mode || (mode[0] != 'r' && mode[0] != 'w')) {
		errno = EINVAL;
		return NULL;
	}
	if (!(e = calloc(1, sizeof(*e))) || pipe2(p, O_CLOEXEC) < 0) {
		free(e);
		return NULL;
	}
	child_end = reading ? p[1] : p[0];
	parent_end = reading ? p[0] : p[1];
	op = (struct fa_op){ .kind = FA_DUP2, .fd = child_end, .newfd = reading ? 1 : 0 };
	pid = shell(cmd, &op, 1, NULL);
	close(child_end);
	if (pid < 0 || !(f = fdopen(parent_end, reading ? "r" : "w"))) {
		int err = errno;
		close(parent_end);
		if (pid > 0)
			while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
				;
		free(e);
		errno = err;
		return NULL;
	}
	e->f = f;
	e->pid = pid;
	pthread_mutex_lock(&popen_lock);
	e->next = popened;
	popened = e;
	pthread_mutex_unlock(&popen_lock);
	return f;
}

EXPORT int pclose(FILE *f)
{
	REAL(pclose);
	struct popened *e = NULL;
	int status = -1;

	pthread_mutex_lock(&popen_lock);
	for (struct popened **pp = &popened; *pp; pp = &(*pp)->next)
		if ((*pp)->f == f) {
			e = *pp;
			*pp = e->next;
			break;
		}
	pthread_mutex_unlock(&popen_lock);
	if (!e)
		return real_pclose(f);
	fclose(f);
	while (waitpid(e->pid, &status, 0) < 0) {
		if (errno != EINTR) {
			status = -1;
			break;
		}
	}
	free(e);
	return status;
}
