/*
 * payoff.c - per-destination memory of how long a client's connections
 * were, to keep short-lived ones on TCP while the CPUs are oversubscribed
 * (see payoff.h).
 *
 * A few entries under one mutex, touched once per connect() and once per
 * close of an accelerated client connection: never on the data path.
 */
#include "payoff.h"

#include "config.h"
#include "forkguard.h"
#include "spin.h"

#include <pthread.h>
#include <string.h>

/*
 * Short: at most two round trips and 16 KiB.  Under load a message through
 * the ring saves roughly 10 us of CPU against TCP, and the handshake costs
 * about 35 us more, so a connection pays from about four messages on; the
 * bar is set at that, not above, so that chatty connections stay fast.
 */
#define SHORT_CALLS    4u
#define SHORT_BYTES    (16u << 10)
#define SHORT_STREAK   8u       /* short ones in a row before we believe it */
#define PROBE_EVERY    256u     /* one connection in this many is tried anyway */
#define DESTS          16

struct dest {
	struct ep ep;
	unsigned used;          /* 0: free slot */
	unsigned streak;        /* short connections in a row (saturates) */
	unsigned declined;      /* kept on TCP since the last probe */
};

static struct dest dests[DESTS];
static unsigned next_victim;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void payoff_init(void)
{
	fork_guard(&lock);
}

static struct dest *dest_find(const struct ep *dst)
{
	for (int i = 0; i < DESTS; i++)
		if (dests[i].used && ep_equal(&dests[i].ep, dst))
			return &dests[i];
	return NULL;
}

int payoff_worth_offering(const struct ep *dst)
{
	struct dest *d;
	int offer = 1;

	/* the busy check first: it may read /proc/loadavg, not under our lock */
	if (!cfg.short_lived || !cores_busy())
		return 1;
	pthread_mutex_lock(&lock);
	d = dest_find(dst);
	if (d && d->streak >= SHORT_STREAK)
		offer = ++d->declined % PROBE_EVERY == 0;
	pthread_mutex_unlock(&lock);
	return offer;
}

void payoff_record(const struct ep *dst, uint32_t calls, uint64_t bytes)
{
	int is_short = calls <= SHORT_CALLS && bytes <= SHORT_BYTES;
	struct dest *d;

	if (!cfg.short_lived)
		return;
	pthread_mutex_lock(&lock);
	if (!(d = dest_find(dst)) && is_short) {
		d = &dests[next_victim++ % DESTS];
		memset(d, 0, sizeof(*d));
		d->ep = *dst;
		d->used = 1;
	}
	if (d) {
		if (!is_short)
			d->streak = 0;
		else if (d->streak < SHORT_STREAK)
			d->streak++;
	}
	pthread_mutex_unlock(&lock);
}
