/*
 * peerid.c - identities of peer processes for region reuse (see peerid.h).
 *
 * The pidfs key costs three system calls (SO_PEERPIDFD, fstat, close), and
 * only where a server made the socket pair (the rendezvous handshake).
 * Whether pidfds live on pidfs is learnt once per process, with fstatfs:
 * on kernels 6.5-6.8 every pidfd shares one anonymous inode, which names no
 * process, and the pid is used as before.
 */
#include "peerid.h"

#include "sys.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#define PIDFS_MAGIC 0x50494446

/* Is pidfs there?  0: not known yet, 1: yes (pidfs_dev holds its device), -1: no. */
static _Atomic int pidfs_state;
static _Atomic dev_t pidfs_dev;

/* Is @pidfd (described by @st) a pidfs inode, one per process?  Learnt once. */
static int on_pidfs(int pidfd, const struct stat *st)
{
	int state = atomic_load_explicit(&pidfs_state, memory_order_acquire);
	struct statfs fs;

	if (state == 0) {
		state = fstatfs(pidfd, &fs) == 0 && fs.f_type == PIDFS_MAGIC ? 1 : -1;
		atomic_store_explicit(&pidfs_dev, st->st_dev, memory_order_relaxed);
		atomic_store_explicit(&pidfs_state, state, memory_order_release);
	}
	return state == 1 && st->st_dev == atomic_load_explicit(&pidfs_dev, memory_order_relaxed);
}

/* The pidfs inode of the process at the other end of @s, or 0. */
static uint64_t pidfs_ino(int s)
{
	int pidfd = -1, ok;
	socklen_t l = sizeof(pidfd);
	struct stat st;

	if (atomic_load_explicit(&pidfs_state, memory_order_relaxed) < 0)
		return 0;
	if (sys_getsockopt(s, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &l) < 0 || pidfd < 0) {
		/* a kernel before 6.5 knows no such option: ask no more (an exited
		 * peer is ESRCH, or EINVAL on some kernels: that one only) */
		if (errno == ENOPROTOOPT)
			atomic_store_explicit(&pidfs_state, -1, memory_order_relaxed);
		return 0;
	}
	ok = fstat(pidfd, &st) == 0 && on_pidfs(pidfd, &st);
	sys_close(pidfd);
	return ok ? (uint64_t)st.st_ino : 0;
}

peerid peerid_of_socket(int s, pid_t pid)
{
	uint64_t ino = pidfs_ino(s);

	if (ino)
		return peerid_make(PEERID_PIDFS, ino);
	/* pidfs present but this peer not named by it (it exited): no key */
	if (atomic_load_explicit(&pidfs_state, memory_order_relaxed) > 0)
		return PEERID_NONE;
	return pid > 0 ? peerid_make(PEERID_PID, (uint64_t)pid) : PEERID_NONE;
}
