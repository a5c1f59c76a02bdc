/*
 * payoff.h - does accelerating the next connection to this peer pay?
 *
 * An accelerated connection costs more CPU to set up than a TCP one (a
 * socket pair, an offer with three descriptors, the checks on both sides:
 * about 35 us more for both ends together in smclo bench, 130-190 us for
 * apache2 and ab, docs/performance.md) and saves
 * CPU on every message it carries.  While a CPU is idle the handshake's
 * wait is hidden by spinning and the extra CPU comes from idle time; when
 * more tasks are runnable than there are CPUs, CPU time is what a
 * connection costs, and one that carries a request and an answer is slower
 * accelerated than on TCP.
 *
 * So clients remember, per destination and in the registry's shared page
 * (every process of the registry adds to and reads the same memory; in a
 * registry shared between users each process keeps its own, registry.h),
 * whether the recent connections there were short (two round trips at
 * most, less data than pays for the set-up).  After SHORT_STREAK short ones in a row, while the CPUs are
 * oversubscribed or the process may run on one CPU only, the next connections to it stay on TCP with the reason
 * `short-lived` - except one in PROBE_EVERY (and at most one every
 * PROBE_GAP_MS), which is accelerated to learn whether the pattern changed.
 * The kernel's SMC does the same under handshake congestion (limit_smc_hs).
 * SMCLO_SHORT_LIVED=0 accelerates every connection regardless.
 */
#ifndef SMCLO_PAYOFF_H
#define SMCLO_PAYOFF_H

#include "addr.h"

#include <stdint.h>

/* 1: offer to accelerate a connection to @dst; 0: leave it on TCP (short-lived). */
int payoff_worth_offering(const struct ep *dst);

/* A client's accelerated connection to @dst ended after @messages (turns
 * of direction among the reads and writes that moved data), @bytes in both
 * directions. */
void payoff_record(const struct ep *dst, uint32_t messages, uint64_t bytes);
/*
 * A client's connection to @dst was set up without TCP (client.c, the direct
 * handshake), which costs less than TCP's: it paid whatever it carried, so
 * the destination's streak of short ones starts again.
 */
void payoff_record_paid(const struct ep *dst);

#endif
