/*
 * totals.c - `smclo stats`: totals since the registry was created or reset
 * (like `smcd stats`), for people (text), programs (--json) and monitoring
 * (--prometheus: the Prometheus text exposition format, version 0.0.4).
 *
 * One table names every plain counter for the JSON and Prometheus outputs,
 * so the two cannot drift apart.  Prometheus also gets gauges of what is
 * live now (connections by mode, listeners), which have no total.
 */
#include "cli.h"

#include "config.h"
#include "registry.h"
#include "stats.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define TOT(f) offsetof(struct stats_totals, f)

static const struct counter {
	const char *json;       /* key in --json */
	const char *prom;       /* smclo_<prom>_total in --prometheus */
	const char *help;
	size_t off;
} counters[] = {
	{ "handshake_errors", "handshake_errors", "Handshakes that failed on a malformed or "
	  "unexpected message.", TOT(handshake_errors) },
	{ "tx_bytes", "shm_sent_bytes", "Bytes sent through shared memory by connections "
	  "that have closed.", TOT(tx_bytes) },
	{ "rx_bytes", "shm_received_bytes", "Bytes received through shared memory by "
	  "connections that have closed.", TOT(rx_bytes) },
	{ "closed", "connections_closed", "Connection ends closed, accelerated or left on TCP.",
	  TOT(conns_closed) },
	{ "regions_created", "regions_created", "Ring regions created anew.",
	  TOT(regions_created) },
	{ "regions_reused", "regions_reused", "Ring regions taken again from the pool.",
	  TOT(regions_reused) },
	{ "doorbells_sent", "doorbells_sent", "Doorbells rung (counted when connections close).",
	  TOT(bells_sent) },
	{ "doorbells_skipped", "doorbells_skipped", "Doorbells not needed: the reader was "
	  "watching its ring.", TOT(bells_skipped) },
	{ "inbox_handshakes", "inbox_handshakes", "Accelerated connections set up with one "
	  "offer to the server's inbox.", TOT(inbox_handshakes) },
	{ "peer_regions_mapped", "peer_regions_mapped", "Servers: clients' regions mapped anew.",
	  TOT(peer_regions_mapped) },
	{ "peer_regions_kept", "peer_regions_kept", "Servers: clients' regions found still "
	  "mapped from an earlier connection.", TOT(peer_regions_kept) },
	{ "direct_handshakes", "direct_handshakes", "Accelerated connections taken without TCP "
	  "(the server waited in accept()).", TOT(direct_handshakes) },
	{ "pool_sends_by_reference", "pool_sends_by_reference", "Buffer pool sends the peer "
	  "read in place (native API).", TOT(pool_sends_by_reference) },
	{ "pool_sends_copied", "pool_sends_copied", "Buffer pool sends whose bytes were "
	  "copied (TCP, or before the peer mapped the pool).", TOT(pool_sends_copied) },
	{ "pool_sends_kernel", "pool_sends_kernel", "Buffer pool sends by the kernel's zero "
	  "copy (TCP to another host).", TOT(pool_sends_kernel) },
	{ "pool_sends_reclaimed", "pool_sends_reclaimed", "Buffer pool sends taken back "
	  "because the peer went away first.", TOT(pool_sends_reclaimed) },
};
#define N_COUNTERS (sizeof(counters) / sizeof(counters[0]))

static unsigned long long counter_value(const struct stats_totals *t, const struct counter *c)
{
	return (unsigned long long)*(const _Atomic uint64_t *)((const char *)t + c->off);
}

static void print_json(const char *dir, const struct stats_totals *t)
{
	printf("{\"registry\": ");
	json_string(dir);
	printf(", \"since\": %lld, \"accelerated\": %llu, \"accelerated_client\": %llu, "
	       "\"accelerated_server\": %llu, \"fallback\": %llu", (long long)t->reset,
	       (unsigned long long)(t->accelerated[ROLE_CLIENT] + t->accelerated[ROLE_SERVER]),
	       (unsigned long long)t->accelerated[ROLE_CLIENT],
	       (unsigned long long)t->accelerated[ROLE_SERVER],
	       (unsigned long long)stats_fallbacks(t));
	for (size_t i = 0; i < N_COUNTERS; i++)
		printf(", \"%s\": %llu", counters[i].json, counter_value(t, &counters[i]));
	printf(", \"fallback_not_short_lived\": %llu, \"fallback_by_reason\": {",
	       (unsigned long long)stats_fallback_not_short_lived(t));
	for (int r = R_NONE + 1; r < R_COUNT; r++)
		printf("%s\"%s\": %llu", r > R_NONE + 1 ? ", " : "", reason_id(r),
		       (unsigned long long)t->fallback[r]);
	printf("}, \"moved_by_reason\": {");
	for (int r = R_NONE + 1; r < R_COUNT; r++)
		printf("%s\"%s\": %llu", r > R_NONE + 1 ? ", " : "", reason_id(r),
		       (unsigned long long)t->moved[r]);
	printf("}}\n");
}

static void print_text(const char *dir, const struct stats_totals *t)
{
	time_t since = (time_t)t->reset;

	printf("registry        %s\nsince           %s", dir, ctime(&since));
	printf("connection ends accelerated %llu (client %llu, server %llu)\n",
	       (unsigned long long)(t->accelerated[ROLE_CLIENT] + t->accelerated[ROLE_SERVER]),
	       (unsigned long long)t->accelerated[ROLE_CLIENT],
	       (unsigned long long)t->accelerated[ROLE_SERVER]);
	printf("connection ends on tcp      %llu\n", (unsigned long long)stats_fallbacks(t));
	for (int r = R_NONE + 1; r < R_COUNT; r++)
		if (t->fallback[r])
			printf("  %-32s %llu\n", reason_text(r), (unsigned long long)t->fallback[r]);
	for (int r = R_NONE + 1; r < R_COUNT; r++)
		if (t->moved[r])
			printf("moved to tcp: %-18s %llu\n", reason_id(r),
			       (unsigned long long)t->moved[r]);
	printf("handshake errors            %llu\n", (unsigned long long)t->handshake_errors);
	printf("bytes sent through shm      %llu   (connections closed so far)\n",
	       (unsigned long long)t->tx_bytes);
	printf("bytes received through shm  %llu\n", (unsigned long long)t->rx_bytes);
	printf("ring regions created        %llu, reused %llu\n",
	       (unsigned long long)t->regions_created, (unsigned long long)t->regions_reused);
	printf("clients' regions mapped     %llu, still mapped from before %llu\n",
	       (unsigned long long)t->peer_regions_mapped, (unsigned long long)t->peer_regions_kept);
	printf("doorbells rung              %llu, skipped for a watching reader %llu\n",
	       (unsigned long long)t->bells_sent, (unsigned long long)t->bells_skipped);
	printf("handshakes through an inbox %llu (one message; the rest used a rendezvous)\n",
	       (unsigned long long)t->inbox_handshakes);
	printf("  and without TCP           %llu (direct: the server waited in accept())\n",
	       (unsigned long long)t->direct_handshakes);
	printf("pool sends read in place    %llu, copied %llu, kernel zero copy %llu, "
	       "reclaimed %llu\n", (unsigned long long)t->pool_sends_by_reference,
	       (unsigned long long)t->pool_sends_copied, (unsigned long long)t->pool_sends_kernel,
	       (unsigned long long)t->pool_sends_reclaimed);
}

/* ---- Prometheus ----------------------------------------------------------- */

static void prom_family(const char *name, const char *type, const char *help)
{
	printf("# HELP smclo_%s %s\n# TYPE smclo_%s %s\n", name, help, name, type);
}

/* What is live now: connections by mode, and listeners. */
struct live {
	unsigned long long by_mode[3], listeners;
};

static void count_slot(const struct stat_slot *s, void *arg)
{
	struct live *l = arg;

	if (s->mode < 3)
		l->by_mode[s->mode]++;
}

static void count_listener(const struct registry_listener *e, void *arg)
{
	((struct live *)arg)->listeners++;
}

static void print_prometheus_live(int dirfd)
{
	static const char *const modes[] = { "pending", "shm", "tcp" };
	struct live l = { { 0 }, 0 };

	stats_for_each(dirfd, count_slot, &l);
	registry_listeners_each(dirfd, count_listener, &l);
	prom_family("connections", "gauge", "Live connection ends by mode: shm (accelerated), "
	            "tcp (left on TCP), pending (being decided).");
	for (int m = 0; m < 3; m++)
		printf("smclo_connections{mode=\"%s\"} %llu\n", modes[m], l.by_mode[m]);
	prom_family("listeners", "gauge", "Listening sockets of smclo processes (one per "
	            "process that accepts on it).");
	printf("smclo_listeners %llu\n", l.listeners);
}

/*
 * Counters end in _total (the format's rule); every reason is present even
 * at 0, so a rate() of one that starts has a series to start from.
 */
static void print_prometheus(int dirfd, const struct stats_totals *t)
{
	prom_family("accelerated_total", "counter", "Connection ends switched to shared memory, "
	            "by role.");
	printf("smclo_accelerated_total{role=\"client\"} %llu\n",
	       (unsigned long long)t->accelerated[ROLE_CLIENT]);
	printf("smclo_accelerated_total{role=\"server\"} %llu\n",
	       (unsigned long long)t->accelerated[ROLE_SERVER]);
	prom_family("fallback_total", "counter", "Connection ends left on TCP, by reason "
	            "(smclo stat names them).");
	for (int r = R_NONE + 1; r < R_COUNT; r++)
		printf("smclo_fallback_total{reason=\"%s\"} %llu\n", reason_id(r),
		       (unsigned long long)t->fallback[r]);
	prom_family("moved_total", "counter", "Accelerated connection ends that went on over "
	            "TCP, by reason.");
	for (int r = R_NONE + 1; r < R_COUNT; r++)
		printf("smclo_moved_total{reason=\"%s\"} %llu\n", reason_id(r),
		       (unsigned long long)t->moved[r]);
	for (size_t i = 0; i < N_COUNTERS; i++) {
		char name[64];
		snprintf(name, sizeof(name), "%s_total", counters[i].prom);
		prom_family(name, "counter", counters[i].help);
		printf("smclo_%s %llu\n", name, counter_value(t, &counters[i]));
	}
	prom_family("reset_timestamp_seconds", "gauge", "When the totals were created or last "
	            "reset (Unix time).");
	printf("smclo_reset_timestamp_seconds %lld\n", (long long)t->reset);
	print_prometheus_live(dirfd);
}

static int parse_stats_opts(int argc, char **argv, int *format, int *reset)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			*format = 'j';
		else if (!strcmp(argv[i], "--prometheus"))
			*format = 'p';
		else if (!strcmp(argv[i], "--reset"))
			*reset = 1;
		else
			return usage_error("stats: unknown option '%s' (--json, --prometheus, --reset)",
			                   argv[i]);
	}
	return 0;
}

int cmd_stats(int argc, char **argv)
{
	struct smclo_config c;
	struct stats_totals *mine, sum;
	int format = 't', reset = 0, dirfd, rc;

	if ((rc = parse_stats_opts(argc, argv, &format, &reset)) ||
	    (rc = cli_registry_open(&c, &dirfd, &mine)))
		return rc;
	if (reset) {
		stats_reset(mine);      /* others' totals are theirs to reset */
		if (format == 't')
			printf("smclo: totals reset\n");
	}
	stats_totals_sum(dirfd, &sum);
	if (format == 'j')
		print_json(c.dir, &sum);
	else if (format == 'p')
		print_prometheus(dirfd, &sum);
	else
		print_text(c.dir, &sum);
	return 0;
}
