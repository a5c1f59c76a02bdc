/*
 * payoff.c - per-destination memory of how long clients' connections
 * were, to keep short-lived ones on TCP while the CPUs are oversubscribed
 * (see payoff.h).
 *
 * The memory is the registry's shared page (registry_dests), so every
 * process of the registry learns from the others: a new process's first
 * connections are judged by what its predecessors saw (in a registry shared
 * between users, the page is the process's own: registry.h).  Touched once per
 * connect() on a busy machine and once per close of an accelerated client
 * connection: never on the data path.  Plain atomics, no lock: a lost
 * update between two processes only shifts a streak by one.
 */
#include "payoff.h"

#include "config.h"
#include "conn.h"
#include "cpus.h"
#include "registry.h"
#include "sys.h"

#include <string.h>

/*
 * Short: at most two round trips (four messages: turns of direction, so an
 * answer read in many pieces is one) and 16 KiB.  Under load a message
 * through the ring saves roughly 10 us of CPU against TCP, and the
 * handshake costs about 35 us more, so a connection pays from about four
 * messages on; the bar is set at that, not above, so that chatty
 * connections stay fast.  By CPU alone the byte bar would be higher (a
 * connection per request to apache2 with a 50 KB answer costs both ends
 * 130-190 us more accelerated, docs/performance.md), but a threaded server
 * under such a load makes the CPUs look busy by itself (cpus_busy), and its
 * connections are to be accelerated there: tried at 256 KiB, apache2's own
 * load kept half of them on TCP.
 */
#define SHORT_MESSAGES 4u
#define SHORT_BYTES    (16u << 10)
#define SHORT_STREAK   8u       /* short ones in a row before we believe it */
#define PROBE_EVERY    256u     /* one connection in this many is tried anyway, */
#define PROBE_GAP_MS   250u     /* and not more often than this: a probe costs a wait */

/* A 64-bit finalizer (MurmurHash3's): every input bit moves every output bit. */
static uint64_t mix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 33);
}

/*
 * The address's two halves and the port, mixed: a handful of instructions,
 * for this runs on every connect() of a busy machine.  Never 0, which marks
 * a free entry (and not forced odd: the low bits pick the entry).
 */
static uint64_t dest_key(const struct ep *dst)
{
	uint64_t hi, lo, h;

	memcpy(&hi, dst->ip, 8);
	memcpy(&lo, dst->ip + 8, 8);
	h = mix64(hi ^ mix64(lo ^ dst->port));
	return h ? h : 1;
}

/* The shared entry @dst maps to (it may hold another destination), or NULL. */
static struct registry_dest *dest_entry(const struct ep *dst, uint64_t *key)
{
	struct registry_dest *t = registry_fd >= 0 ? registry_dests(registry_fd) : NULL;

	*key = dest_key(dst);
	return t ? &t[*key % REGISTRY_DESTS] : NULL;
}

/*
 * One connection kept on TCP more; 1 if it should be tried accelerated
 * instead: after PROBE_EVERY declined and PROBE_GAP_MS since the last probe
 * (beside busy loops an accelerated connection waits for its peer to be
 * scheduled, up to milliseconds, so at thousands of connections a second
 * the count alone would probe too often).  Of processes racing for the
 * same probe, one wins it.  Any value a peer left here only moves a probe.
 */
static int probe_due(struct registry_dest *d)
{
	uint32_t now = (uint32_t)mono_now_ms(), last;

	if (atomic_fetch_add_explicit(&d->declined, 1, memory_order_relaxed) + 1 < PROBE_EVERY)
		return 0;
	last = atomic_load_explicit(&d->probed_ms, memory_order_relaxed);
	if (now - last < PROBE_GAP_MS ||
	    !atomic_compare_exchange_strong(&d->probed_ms, &last, now))
		return 0;
	atomic_store_explicit(&d->declined, 0, memory_order_relaxed);
	return 1;
}

int payoff_worth_offering(const struct ep *dst)
{
	struct registry_dest *d;
	uint64_t key;

	/* the busy check first: an idle machine's connect() reads nothing shared */
	if (!cfg.short_lived || !cpus_busy())
		return 1;
	d = dest_entry(dst, &key);
	if (!d || atomic_load_explicit(&d->key, memory_order_relaxed) != key ||
	    atomic_load_explicit(&d->streak, memory_order_relaxed) < SHORT_STREAK)
		return 1;
	return probe_due(d);
}

void payoff_record_paid(const struct ep *dst)
{
	struct registry_dest *d;
	uint64_t key;

	if (cfg.short_lived && (d = dest_entry(dst, &key)) &&
	    atomic_load_explicit(&d->key, memory_order_relaxed) == key)
		atomic_store_explicit(&d->streak, 0, memory_order_relaxed);
}

void payoff_record(const struct ep *dst, uint32_t messages, uint64_t bytes)
{
	int is_short = messages <= SHORT_MESSAGES && bytes <= SHORT_BYTES;
	struct registry_dest *d;
	uint64_t key;

	if (!cfg.short_lived || !(d = dest_entry(dst, &key)))
		return;
	if (atomic_load_explicit(&d->key, memory_order_relaxed) != key) {
		if (!is_short)
			return;         /* nothing to forget */
		/* take the entry over; a race with another process costs a streak */
		atomic_store_explicit(&d->streak, 0, memory_order_relaxed);
		atomic_store_explicit(&d->key, key, memory_order_relaxed);
	}
	if (!is_short)
		atomic_store_explicit(&d->streak, 0, memory_order_relaxed);
	else if (atomic_load_explicit(&d->streak, memory_order_relaxed) < SHORT_STREAK)
		atomic_fetch_add_explicit(&d->streak, 1, memory_order_relaxed);
}
