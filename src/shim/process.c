/*
 * process.c - what a process does to itself that smclo must hear of: a
 * change of user (listeners say so in the registry while they still may),
 * of its descriptor limit (the budget and the hidden range move), of its
 * root directory, and fork (the child is counted as one more holder of each
 * connection before it exists: fd/fdfork.c).
 */
#include "shim.h"

#include <sys/resource.h>

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
	int rc;

	if (res == RLIMIT_NOFILE)
		seccomp_nofile_lowering(rl->rlim_cur);
	rc = real_setrlimit(res, rl);

	if (rc == 0 && res == RLIMIT_NOFILE && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int setrlimit64(__rlimit_resource_t res, const struct rlimit64 *rl)
{
	REAL(setrlimit64);
	int rc;

	if (res == RLIMIT_NOFILE)
		seccomp_nofile_lowering(rl->rlim_cur);
	rc = real_setrlimit64(res, rl);

	if (rc == 0 && res == RLIMIT_NOFILE && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int prlimit(pid_t pid, __rlimit_resource_t res, const struct rlimit *nl,
                   struct rlimit *ol)
{
	REAL(prlimit);
	int rc;

	if (nl && res == RLIMIT_NOFILE && (pid == 0 || pid == sys_getpid()))
		seccomp_nofile_lowering(nl->rlim_cur);
	rc = real_prlimit(pid, res, nl, ol);

	if (rc == 0 && nl && res == RLIMIT_NOFILE && (pid == 0 || pid == sys_getpid()) && fdtab)
		fd_limit_changed();
	return rc;
}

EXPORT int prlimit64(pid_t pid, __rlimit_resource_t res, const struct rlimit64 *nl,
                     struct rlimit64 *ol)
{
	REAL(prlimit64);
	int rc;

	if (nl && res == RLIMIT_NOFILE && (pid == 0 || pid == sys_getpid()))
		seccomp_nofile_lowering(nl->rlim_cur);
	rc = real_prlimit64(pid, res, nl, ol);

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

	fdfork_begin();
	pid = real_fork();
	if (pid != 0) {
		int e = errno;
		fdfork_end(pid < 0);
		errno = e;
	}
	return pid;
}
