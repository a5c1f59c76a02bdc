/*
 * seccomp.c - a program about to confine itself: prctl(PR_SET_SECCOMP),
 * libseccomp's seccomp_load() (which calls seccomp(2) through syscall()),
 * and a descriptor limit lowered below its connections' numbers (OpenSSH's
 * sandbox sets RLIMIT_NOFILE to 1 just before its filter: no dup3() onto a
 * connection's number is possible after that; shim/process.c calls
 * seccomp_nofile_lowering): those connections move, and the process goes
 * on accelerating what it can.  A program that calls seccomp(2) through
 * syscall() itself is not seen: interposing syscall() would put every raw
 * system call of smclo's own behind a wrapper.
 *
 * A filter may refuse, or kill the process for, any call smclo makes of its
 * own - OpenSSH's privilege-separated child is killed by SIGSYS at the
 * first doorbell's sendto().  So before the call goes to the kernel every
 * connection moves to its TCP socket (handshake/moved.c), and from then on
 * smclo makes no system call but the program's own (and close()); new
 * sockets are left alone.  Whether the filter then installs or not, no
 * byte is lost: the move is lossless either way.
 */
#include "shim.h"

#include "log.h"

#include <stdarg.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>

static void seccomp_coming(void)
{
	int stuck;

	if (!smclo_active)
		return;
	stuck = hs_sandbox();
	DBG("confined (seccomp, descriptor limit): connections moved to TCP (%d could not)",
	    stuck);
}

static void highest_conn_fd(int fd, struct conn *c, void *arg)
{
	int *high = arg;

	if (c->mode == MODE_SHM && fd > *high)
		*high = fd;
}

void seccomp_nofile_lowering(unsigned long soft)
{
	int high = -1;

	if (!smclo_active || conn_count() == 0)
		return;
	fd_for_each_conn(highest_conn_fd, &high);
	if (high >= 0 && soft <= (unsigned long)high) {
		int stuck = hs_move_fds_from((int)soft);

		DBG("descriptor limit %lu: connections from there moved to TCP (%d could not)",
		    soft, stuck);
	}
}

EXPORT int prctl(int option, ...)
{
	REAL(prctl);
	unsigned long a[4];
	va_list ap;

	va_start(ap, option);
	for (int i = 0; i < 4; i++)
		a[i] = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_SECCOMP)
		seccomp_coming();
	return real_prctl(option, a[0], a[1], a[2], a[3]);
}

/*
 * libseccomp's loader (memcached, container runtimes and systemd's tools
 * use it): it reaches the kernel through syscall(), which smclo leaves
 * alone - its own raw system calls go through it too.  The context is
 * libseccomp's own (scmp_filter_ctx).
 */
EXPORT int seccomp_load(const void *ctx)
{
	REAL(seccomp_load);

	if (!real_seccomp_load)
		return -ENOSYS;         /* cannot be: the program calls it, so it is there */
	seccomp_coming();
	return real_seccomp_load(ctx);
}
