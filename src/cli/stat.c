/*
 * stat.c - `smclo stat` (live connections, like smc-tools' smcss) and
 * `smclo stats` (totals, like `smcd stats`).
 *
 * Both first tidy the registry: tables of processes that died are folded
 * into the totals and entries nobody holds any more are removed.
 */
#include "cli.h"

#include "config.h"
#include "registry.h"
#include "stats.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const mode_names[] = { "pending", "shm", "tcp" };

static int open_registry(struct smclo_config *c, int *dirfd, struct stats_totals **tot)
{
	char err[300];

	if (config_load(c, err, sizeof(err)) < 0)
		return usage_error("%s", err);
	*dirfd = registry_open(c->dir, c->dir_is_default, err, sizeof(err));
	if (*dirfd < 0)
		return usage_error("%s", err);
	*tot = stats_totals_map(*dirfd);
	if (!*tot && errno != EPERM && errno != EPROTO)
		return usage_error("registry %s: cannot map %s/t/%u for this user's totals: %s",
		                   c->dir, c->dir, (unsigned)geteuid(), strerror(errno));
	if (!*tot)
		return usage_error("registry %s: cannot use %s/t/%u for this user's totals: it "
		                   "must be " STATS_TOTALS_RULE " (remove it)", c->dir, c->dir,
		                   (unsigned)geteuid());
	stats_collect_dead(*dirfd, *tot);
	registry_gc(*dirfd);
	return 0;
}

static int parse_flags(int argc, char **argv, int *json, int *reset, const char *cmd)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			*json = 1;
		else if (reset && !strcmp(argv[i], "--reset"))
			*reset = 1;
		else
			return usage_error("%s: unknown option '%s'", cmd, argv[i]);
	}
	return 0;
}

struct stat_out {
	int json, n;
};

static void print_slot(const struct stat_slot *s, void *arg)
{
	struct stat_out *o = arg;
	char l[64], p[64];
	const char *mode = s->mode < 3 ? mode_names[s->mode] : "?";
	const char *role = s->role == ROLE_SERVER ? "server" : "client";

	ep_format(&s->local, l, sizeof(l));
	ep_format(&s->peer, p, sizeof(p));
	if (o->json) {
		/* bytes are counted on the shared-memory path only; TCP ones pass straight through */
		printf("%s\n    {\"pid\": %d, \"fd\": %d, \"role\": \"%s\", \"local\": \"%s\", "
		       "\"peer\": \"%s\", \"mode\": \"%s\", \"reason\": \"%s\", "
		       "\"reason_text\": \"%s\", \"tx_bytes\": %lld, \"rx_bytes\": %lld, "
		       "\"tx_ring\": %u, \"rx_ring\": %u, \"tx_fill\": %u, \"rx_fill\": %u}",
		       o->n ? "," : "", s->pid, s->fd, role, l, p, mode,
		       s->mode == MODE_TCP ? reason_id(s->reason) : "",
		       s->mode == MODE_TCP ? reason_text(s->reason) : "",
		       s->mode == MODE_SHM ? (long long)s->tx_bytes : -1LL,
		       s->mode == MODE_SHM ? (long long)s->rx_bytes : -1LL,
		       s->tx_ring, s->rx_ring, s->tx_fill, s->rx_fill);
	} else {
		char ring[32] = "-", tx[24] = "-", rx[24] = "-", fill[16] = "-";
		if (s->mode == MODE_SHM) {
			snprintf(ring, sizeof(ring), "%uk/%uk", s->tx_ring >> 10, s->rx_ring >> 10);
			snprintf(tx, sizeof(tx), "%llu", (unsigned long long)s->tx_bytes);
			snprintf(rx, sizeof(rx), "%llu", (unsigned long long)s->rx_bytes);
			snprintf(fill, sizeof(fill), "%u", s->rx_fill);
		}
		printf("%-7d %-4d %-6s %-22s %-22s %-4s %12s %12s %-11s %-9s %s\n",
		       s->pid, s->fd, role, l, p, mode, tx, rx, ring, fill,
		       s->mode == MODE_TCP ? reason_text(s->reason) : "");
	}
	o->n++;
}

int cmd_stat(int argc, char **argv)
{
	struct smclo_config c;
	struct stats_totals *tot;
	struct stat_out o = { 0 };
	int dirfd, rc;

	if ((rc = parse_flags(argc, argv, &o.json, NULL, "stat")) ||
	    (rc = open_registry(&c, &dirfd, &tot)))
		return rc;
	if (o.json)
		printf("{\"registry\": \"%s\", \"connections\": [", c.dir);
	else
		printf("%-7s %-4s %-6s %-22s %-22s %-4s %12s %12s %-11s %-9s %s\n", "PID", "FD",
		       "ROLE", "LOCAL", "PEER", "MODE", "TX-BYTES", "RX-BYTES", "RING TX/RX",
		       "RX-FILL", "FALLBACK REASON");
	stats_for_each(dirfd, print_slot, &o);
	if (o.json)
		printf("%s]}\n", o.n ? "\n  " : "");
	return 0;
}

int cmd_stats(int argc, char **argv)
{
	struct smclo_config c;
	struct stats_totals *mine, sum, *t = &sum;
	int json = 0, reset = 0, dirfd, rc;
	uint64_t fallbacks;

	if ((rc = parse_flags(argc, argv, &json, &reset, "stats")) ||
	    (rc = open_registry(&c, &dirfd, &mine)))
		return rc;
	if (reset) {
		stats_reset(mine);      /* others' totals are theirs to reset */
		if (!json)
			printf("smclo: totals reset\n");
	}
	stats_totals_sum(dirfd, &sum);
	fallbacks = stats_fallbacks(t);
	if (json) {
		printf("{\"registry\": \"%s\", \"since\": %lld, \"accelerated\": %llu, "
		       "\"accelerated_client\": %llu, \"accelerated_server\": %llu, "
		       "\"fallback\": %llu, \"handshake_errors\": %llu, \"tx_bytes\": %llu, "
		       "\"rx_bytes\": %llu, \"closed\": %llu, \"regions_created\": %llu, "
		       "\"regions_reused\": %llu, \"doorbells_sent\": %llu, "
		       "\"doorbells_skipped\": %llu, \"inbox_handshakes\": %llu, "
		       "\"peer_regions_mapped\": %llu, \"peer_regions_kept\": %llu, "
		       "\"direct_handshakes\": %llu, "
		       "\"fallback_not_short_lived\": %llu, \"fallback_by_reason\": {",
		       c.dir, (long long)t->reset,
		       (unsigned long long)(t->accelerated[1] + t->accelerated[2]),
		       (unsigned long long)t->accelerated[1], (unsigned long long)t->accelerated[2],
		       (unsigned long long)fallbacks, (unsigned long long)t->handshake_errors,
		       (unsigned long long)t->tx_bytes, (unsigned long long)t->rx_bytes,
		       (unsigned long long)t->conns_closed,
		       (unsigned long long)t->regions_created, (unsigned long long)t->regions_reused,
		       (unsigned long long)t->bells_sent, (unsigned long long)t->bells_skipped,
		       (unsigned long long)t->inbox_handshakes,
		       (unsigned long long)t->peer_regions_mapped,
		       (unsigned long long)t->peer_regions_kept,
		       (unsigned long long)t->direct_handshakes,
		       (unsigned long long)stats_fallback_not_short_lived(t));
		for (int r = 1, n = 0; r < R_COUNT; r++)
			printf("%s\"%s\": %llu", n++ ? ", " : "", reason_id(r),
			       (unsigned long long)t->fallback[r]);
		printf("}}\n");
		return 0;
	}
	time_t since = (time_t)t->reset;
	printf("registry        %s\nsince           %s", c.dir, ctime(&since));
	printf("connection ends accelerated %llu (client %llu, server %llu)\n",
	       (unsigned long long)(t->accelerated[1] + t->accelerated[2]),
	       (unsigned long long)t->accelerated[1], (unsigned long long)t->accelerated[2]);
	printf("connection ends on tcp      %llu\n", (unsigned long long)fallbacks);
	for (int r = 1; r < R_COUNT; r++)
		if (t->fallback[r])
			printf("  %-32s %llu\n", reason_text(r), (unsigned long long)t->fallback[r]);
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
	return 0;
}
