/*
 * spin.h - watch shared memory for a moment before going to sleep.
 *
 * Measured on this project's 2-vCPU machine, a sleep and wake-up through the
 * kernel costs 10-15 us, far more than the copy a reader or writer is usually
 * waiting for.  So a blocking reader (or a writer facing a full ring) watches
 * the ring for up to SPIN_NS first.  Doorbells are still sent, so readiness
 * stays exact; they just need not wake anybody.  Never for a non-blocking
 * descriptor (which must return at once), never while more tasks are
 * runnable than there are CPUs (cpus.h), and in a process confined to one
 * CPU (taskset, a cpuset, a one-CPU machine) by where the peer last ran:
 * on another CPU the waiter spins, on ours it yields the CPU between looks
 * (SPIN_YIELD), unknown it does not watch.  Each end of a connection notes
 * its CPU in its ring header (ring_hdr.cpu), the other reads it.
 */
#ifndef SMCLO_SPIN_H
#define SMCLO_SPIN_H

#include <stdatomic.h>
#include <stdint.h>

#define SPIN_NS 30000

/* The CPU this thread runs on, plus one (0: not known): a peer's view of us. */
uint32_t spin_cpu_tag(void);
/* Note it in @slot (our ring header's cpu), for the peer's waits. */
void spin_note_cpu(_Atomic uint32_t *slot);

/*
 * Watch until *@word differs from @seen or *@flags is non-zero (the peer
 * closed or shut down), for at most SPIN_NS; nothing for a @nonblock
 * descriptor.  @peer_cpu: where the peer last ran (its ring header's cpu;
 * 0 not known).  Returns 1 if something changed.
 */
int spin_for_change(int nonblock, uint32_t peer_cpu, const _Atomic uint64_t *word, uint64_t seen,
                    const _Atomic uint32_t *flags);

/*
 * Watch a 32-bit word for up to @ns (a caller that waits for a peer to wake
 * up spins longer than SPIN_NS); same conditions, the peer's CPU not known.
 * 1 if it left @seen.
 */
int spin_for_word(const _Atomic uint32_t *word, uint32_t seen, long long ns);

/*
 * The handshake's version: poll @fd without sleeping for at most SPIN_NS
 * (the peer's answer is a few microseconds of work away).  Returns 1 once
 * @events are pending, 0 if the caller should sleep.
 */
int spin_poll(int fd, short events);

/*
 * A lock for the library's short lists that is held only to copy a few
 * words, never across a system call (deferred.c, pairs.c), so a waiter
 * spins instead of sleeping.  A fork child clears it: a thread of the
 * parent may have held it.
 */
static inline void spin_lock_take(atomic_flag *lock)
{
	while (atomic_flag_test_and_set_explicit(lock, memory_order_acquire))
		__builtin_ia32_pause();
}

static inline void spin_lock_drop(atomic_flag *lock)
{
	atomic_flag_clear_explicit(lock, memory_order_release);
}

/*
 * For waiters that watch many things at once (epoll_watch.c): the end of a spin
 * starting now, or 0 when watching does not pay (more runnable tasks than
 * CPUs; one CPU allowed and no peer's CPU known: @peer_cpu as
 * spin_for_change's), on the clock of mono_now_ns() (sys.h); *@way says
 * how to wait between looks (spin_relax).
 */
long long spin_deadline(uint32_t peer_cpu, int *way);

/* How a watch waits between its looks (*way of spin_deadline): a pause
 * instruction, or sched_yield() while the peer shares our CPU and needs it
 * to write what we wait for. */
#define SPIN_OFF   0
#define SPIN_BUSY  1
#define SPIN_YIELD 2
void spin_relax(int way);
/* Looks between two readings of the clock: @busy for pauses (cheap enough
 * to amortise the vDSO call), one for yields (a yield may give the peer a
 * whole slice: the clock, read at once, keeps the watch to its time). */
int spin_looks(int way, int busy);
/*
 * For waits over many connections (poll, an epoll set): whether where the
 * peers run matters at all (this process may run on one CPU only; if not,
 * every wait spins alike and no peer need be looked at), and of the CPU
 * picked so far and a further @peer's, the one the wait weighs: a peer
 * elsewhere than @mine (spin_cpu_tag) beats one on our CPU, known beats
 * unknown - once one elsewhere is picked the look may stop.
 */
int spin_confined(void);
uint32_t spin_peer_pick(uint32_t picked, uint32_t peer, uint32_t mine);
/* Never spin again in this process: its system calls are limited (a
 * seccomp filter), and deciding whether to spin reads /proc. */
void spin_forbid(void);

/*
 * Work worth doing in time a waiter would otherwise spend spinning (closes
 * put off, a socket pair made ahead): @fn, set once by an upper layer at
 * start, returns non-zero if it did any.  A hook, so that this layer calls
 * nothing above it.
 */
void spin_set_idle_work(int (*fn)(void));

#endif
