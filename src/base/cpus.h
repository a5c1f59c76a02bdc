/*
 * cpus.h - how much CPU this process has, for the decisions that depend on it.
 *
 * Two of smclo's choices only pay when the peer can run while we wait:
 * spinning before a sleep (spin.h) and accelerating a connection that carries
 * one small request (payoff.h).  Whether it can depends on the CPUs online,
 * the CPUs the process may run on (taskset, a container's cpuset), its
 * cgroup's CPU quota (a container's --cpus) and how many tasks want to run.
 * Every answer is a sample: the affinity and the load are re-read at most
 * every 50 ms, the quota every second; @now is mono_now_ns() (sys.h).
 */
#ifndef SMCLO_CPUS_H
#define SMCLO_CPUS_H

/* CPUs online in the machine. */
int cpus_online(void);

/* CPUs the process may run on (its affinity mask). */
int cpus_allowed(long long now);

/*
 * Whole CPUs the process's cgroup may use (the smallest quota over period
 * of its cgroup and those above it, rounded up), or 0 when there is no
 * quota or it cannot be read.
 */
int cpus_quota(long long now);

/*
 * Runnable tasks beyond the CPUs online, from the kernel's count of running
 * tasks (/proc/loadavg).  The count includes the caller, and a sampled
 * instant often catches one passing task.
 */
int cpus_surplus(long long now);

/*
 * Is CPU time, rather than waiting, what a connection costs right now?
 * Clearly more runnable tasks than CPUs, one CPU allowed, or a quota under
 * two CPUs (payoff.h).
 */
int cpus_busy(void);

#endif
