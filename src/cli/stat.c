/*
 * stat.c - `smclo stat`: live connections and listeners, like smc-tools'
 * smcss and iproute2's ss (filters by process, port, state; --watch).
 *
 * A connection left on TCP also shows the process at its other end, when
 * that is on this host: its socket's ends come from one sock_diag dump,
 * the process holding the other end from one pass over /proc (peerinfo.h).
 * The totals (`smclo stats`) are in totals.c; both tidy the registry first:
 * tables of processes that died are folded into the totals and entries
 * nobody holds any more are removed.
 */
#include "cli.h"

#include "config.h"
#include "peerinfo.h"
#include "registry.h"
#include "stats.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const mode_names[] = { "pending", "shm", "tcp" };

int cli_registry_open(struct smclo_config *c, int *dirfd, struct stats_totals **tot)
{
	char err[300];

	if (config_load(c, err, sizeof(err)) < 0)
		return usage_error("%s", err);
	*dirfd = registry_open(c->dir, c->dir_is_default, err, sizeof(err));
	if (*dirfd < 0)
		return usage_error("%s", err);
	if (registry_private_why()) {
		config_private_dir(c->dir, sizeof(c->dir));
		fprintf(stderr, "smclo: registry %s, this user's own (other users' programs are not "
		        "seen): %s\n", c->dir, registry_private_why());
	}
	*tot = stats_totals_map(*dirfd);
	if (!*tot && errno != EPERM && errno != EPROTO)
		return usage_error("registry %s: cannot map %s/t/%u for this user's totals: %s",
		                   c->dir, c->dir, (unsigned)geteuid(), strerror(errno));
	if (!*tot)
		return usage_error("registry %s: cannot use %s/t/%u for this user's totals: it "
		                   "must be " STATS_TOTALS_RULE " (remove it)", c->dir, c->dir,
		                   (unsigned)geteuid());
	cli_registry_tidy(*dirfd, *tot);
	return 0;
}

void cli_registry_tidy(int dirfd, struct stats_totals *tot)
{
	stats_collect_dead(dirfd, tot);
	registry_gc(dirfd);
}

void json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* ---- options -------------------------------------------------------------- */

#define KIND_LISTEN 1u
#define KIND_TCP    2u
#define KIND_SHM    4u
#define KIND_PENDING 8u

struct stat_opts {
	int json;
	int pid, port;          /* 0: any */
	unsigned kinds;         /* KIND_*; none given: every connection, no listener */
	double watch;           /* seconds between refreshes; 0: print once */
	long count;             /* refreshes before stopping; 0: until interrupted */
};

/* @s as a number in [@lo, @hi], whole if @whole; else a usage error naming @opt. */
static int parse_num(const char *opt, const char *s, double lo, double hi, int whole,
                     double *out)
{
	char *end;
	double v;

	errno = 0;
	v = s ? strtod(s, &end) : 0;
	if (!s || !*s || *end || errno || v < lo || v > hi || (whole && v != (long)v))
		return usage_error("stat: %s needs %s from %.*f to %.*f, not '%s'", opt,
		                   whole ? "a whole number" : "a number", !whole, lo, !whole, hi,
		                   s ? s : "(nothing)");
	*out = v;
	return 0;
}

/* `--watch [SECONDS]`: the interval is optional, so only a number is taken as one. */
static int parse_watch(int argc, char **argv, int *i, double *watch)
{
	const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;

	*watch = 2.0;
	if (!next || next[0] == '-')
		return 0;
	(*i)++;
	return parse_num("--watch", next, 0.1, 3600, 0, watch);
}

/* An option with a value (--pid, --port, --count); 1 if @a is none of them. */
static int parse_value_opt(const char *a, const char *v, struct stat_opts *o)
{
	double n = 0;
	int rc;

	if (!strcmp(a, "--pid")) {
		if (!(rc = parse_num(a, v, 1, INT_MAX, 1, &n)))
			o->pid = (int)n;
	} else if (!strcmp(a, "--port")) {
		if (!(rc = parse_num(a, v, 1, 65535, 1, &n)))
			o->port = (int)n;
	} else if (!strcmp(a, "--count")) {
		if (!(rc = parse_num(a, v, 1, 1e9, 1, &n)))
			o->count = (long)n;
	} else {
		rc = 1;
	}
	return rc;
}

static int parse_stat_opt(int argc, char **argv, int *i, struct stat_opts *o)
{
	const char *a = argv[*i];
	int rc;

	if (!strcmp(a, "--json"))
		o->json = 1;
	else if (!strcmp(a, "--listening"))
		o->kinds |= KIND_LISTEN;
	else if (!strcmp(a, "--tcp"))
		o->kinds |= KIND_TCP;
	else if (!strcmp(a, "--shm"))
		o->kinds |= KIND_SHM;
	else if (!strcmp(a, "--watch"))
		return parse_watch(argc, argv, i, &o->watch);
	else if ((rc = parse_value_opt(a, *i + 1 < argc ? argv[*i + 1] : NULL, o)) != 0)
		return rc == 1 ? usage_error("stat: unknown option '%s' (see smclo --help)", a) : rc;
	else
		(*i)++;         /* its value */
	return 0;
}

static int parse_stat_opts(int argc, char **argv, struct stat_opts *o)
{
	int rc = 0;

	for (int i = 1; i < argc && !rc; i++)
		rc = parse_stat_opt(argc, argv, &i, o);
	if (!rc && o->count && !o->watch)
		rc = usage_error("stat: --count N goes with --watch (how many refreshes)");
	if (!o->kinds)
		o->kinds = KIND_TCP | KIND_SHM | KIND_PENDING;
	return rc;
}

/* ---- connections ---------------------------------------------------------- */

struct row {
	struct stat_slot s;
	unsigned long peer_ino;     /* the other end's socket, when on this host */
	int peer_pid;               /* a process holding it; 0: not found */
};

struct rows {
	struct row *v;
	int n, cap;
	const struct stat_opts *o;
};

static unsigned mode_kind(int mode)
{
	return mode == MODE_SHM ? KIND_SHM : mode == MODE_TCP ? KIND_TCP : KIND_PENDING;
}

static int port_matches(const struct stat_opts *o, const struct ep *a, const struct ep *b)
{
	return !o->port || a->port == o->port || b->port == o->port;
}

static void collect_slot(const struct stat_slot *s, void *arg)
{
	struct rows *r = arg;

	if ((r->o->pid && s->pid != r->o->pid) || !(r->o->kinds & mode_kind(s->mode)))
		return;
	if (r->n == r->cap) {
		int cap = r->cap ? 2 * r->cap : 64;
		struct row *v = realloc(r->v, (size_t)cap * sizeof(*v));
		if (!v)
			return;         /* a listing cut short beats none */
		r->v = v;
		r->cap = cap;
	}
	r->v[r->n++] = (struct row){ .s = *s };
}

/*
 * Find the socket of a TCP row and the one at its other end.  Its own is
 * found by its descriptor (its local address may not have been asked of
 * the kernel: it is filled in here), or by its two ends when that
 * descriptor is not ours to read.
 */
static void find_tcp_ends(struct row *w, const struct peerinfo_tcp *list, int n)
{
	const struct peerinfo_tcp *own, *peer = NULL;
	static const struct ep unknown;

	own = peerinfo_tcp_by_ino(list, n, peerinfo_fd_ino(w->s.pid, w->s.fd));
	if (own) {
		if (!memcmp(&w->s.local, &unknown, sizeof(unknown)))
			w->s.local = own->local;
		peer = peerinfo_tcp_by_ends(list, n, &own->remote, &own->local);
	} else if (memcmp(&w->s.local, &unknown, sizeof(unknown))) {
		peer = peerinfo_tcp_by_ends(list, n, &w->s.peer, &w->s.local);
	}
	w->peer_ino = peer ? peer->ino : 0;
}

/* peerinfo_each_socket: the first process seen holding a row's peer socket. */
static int note_holder(int pid, unsigned long ino, void *arg)
{
	struct rows *r = arg;

	for (int i = 0; i < r->n; i++)
		if (r->v[i].peer_ino == ino && !r->v[i].peer_pid)
			r->v[i].peer_pid = pid;
	return 0;
}

/*
 * Who holds the other end of every row: a TCP row's peer socket by its
 * addresses, an accelerated row's by its doorbell socket's (the program's
 * descriptor) peer in the kernel; then one pass over /proc/<pid>/fd.
 */
static void find_peers(struct rows *r)
{
	struct peerinfo_tcp *list;
	int n = -1, any = 0;

	for (int i = 0; i < r->n && !any; i++)
		any = r->v[i].s.mode == MODE_TCP;
	if (any && (n = peerinfo_tcp_list(&list)) < 0)
		any = 0;
	for (int i = 0; i < r->n; i++) {
		struct row *w = &r->v[i];
		if (w->s.mode == MODE_TCP && any)
			find_tcp_ends(w, list, n);
		else if (w->s.mode == MODE_SHM)
			w->peer_ino = peerinfo_unix_peer_of(peerinfo_fd_ino(w->s.pid, w->s.fd));
	}
	if (any)
		free(list);
	peerinfo_each_socket(note_holder, r);
}

/* The rows to show: filtered by process and mode, then (ends known) by port. */
static void collect_rows(int dirfd, struct rows *r)
{
	int kept = 0;

	r->n = 0;
	stats_for_each(dirfd, collect_slot, r);
	find_peers(r);
	for (int i = 0; i < r->n; i++)
		if (port_matches(r->o, &r->v[i].s.local, &r->v[i].s.peer))
			r->v[kept++] = r->v[i];
	r->n = kept;
}

/* ---- printing ------------------------------------------------------------- */

#define ROW_FMT "%-7d %-4s %-6s %-22s %-22s %-4s %12s %12s %-11s %-9s %s\n"

static void print_header(void)
{
	printf("%-7s %-4s %-6s %-22s %-22s %-4s %12s %12s %-11s %-9s %s\n", "PID", "FD",
	       "ROLE", "LOCAL", "PEER", "MODE", "TX-BYTES", "RX-BYTES", "RING TX/RX",
	       "RX-FILL", "FALLBACK REASON / LISTENER");
}

/* The user at the other end, by name (or number), as the kernel says. */
static int peer_user(const struct row *w, char *out, size_t len)
{
	struct passwd pwd, *pw = NULL;
	char buf[1024];
	uid_t uid;

	if (peerinfo_uid(w->peer_pid, &uid) < 0)
		return -1;
	if (getpwuid_r(uid, &pwd, buf, sizeof(buf), &pw) == 0 && pw)
		snprintf(out, len, "%s", pw->pw_name);
	else
		snprintf(out, len, "%u", (unsigned)uid);
	return 0;
}

static void print_row_json(const struct row *w, const char *l, const char *p, int first)
{
	const struct stat_slot *s = &w->s;
	char exe[4096];
	int tcp = s->mode == MODE_TCP, shm = s->mode == MODE_SHM;

	/* bytes are counted on the shared-memory path only; TCP ones pass straight through */
	printf("%s\n    {\"pid\": %d, \"fd\": %d, \"role\": \"%s\", \"local\": \"%s\", "
	       "\"peer\": \"%s\", \"mode\": \"%s\", \"reason\": \"%s\", \"reason_text\": \"%s\", "
	       "\"tx_bytes\": %lld, \"rx_bytes\": %lld, \"tx_ring\": %u, \"rx_ring\": %u, "
	       "\"tx_fill\": %u, \"rx_fill\": %u, \"peer_pid\": ", first ? "" : ",", s->pid, s->fd,
	       s->role == ROLE_SERVER ? "server" : "client", l, p, s->mode < 3 ? mode_names[s->mode] : "?",
	       tcp ? reason_id(s->reason) : "", tcp ? reason_text(s->reason) : "",
	       shm ? (long long)s->tx_bytes : -1LL, shm ? (long long)s->rx_bytes : -1LL,
	       s->tx_ring, s->rx_ring, s->tx_fill, s->rx_fill);
	if (w->peer_pid && peerinfo_exe(w->peer_pid, exe, sizeof(exe)) == 0) {
		char user[64];
		printf("%d, \"peer_exe\": ", w->peer_pid);
		json_string(exe);
		printf(", \"peer_user\": ");
		if (peer_user(w, user, sizeof(user)) == 0)
			json_string(user);
		else
			printf("null");
		printf("}");
	} else {
		printf("null, \"peer_exe\": null, \"peer_user\": null}");
	}
}

/* A row's last column: why it is on TCP, and who is at the other end if we know. */
static void row_why(const struct row *w, char *out, size_t len)
{
	const char *why = w->s.mode == MODE_TCP ? reason_text(w->s.reason) : "";
	char exe[4096], user[64];

	if (w->peer_pid && peerinfo_exe(w->peer_pid, exe, sizeof(exe)) == 0 &&
	    peer_user(w, user, sizeof(user)) == 0)
		snprintf(out, len, "%s%speer %s pid %d %s", why, *why ? "; " : "", user,
		         w->peer_pid, exe);
	else
		snprintf(out, len, "%s", why);
}

static void print_row_text(const struct row *w, const char *l, const char *p)
{
	const struct stat_slot *s = &w->s;
	char fd[16], ring[32] = "-", tx[24] = "-", rx[24] = "-", fill[16] = "-", why[4200] = "";

	snprintf(fd, sizeof(fd), "%d", s->fd);
	if (s->mode == MODE_SHM) {
		snprintf(ring, sizeof(ring), "%uk/%uk", s->tx_ring >> 10, s->rx_ring >> 10);
		snprintf(tx, sizeof(tx), "%llu", (unsigned long long)s->tx_bytes);
		snprintf(rx, sizeof(rx), "%llu", (unsigned long long)s->rx_bytes);
		snprintf(fill, sizeof(fill), "%u", s->rx_fill);
	}
	row_why(w, why, sizeof(why));
	printf(ROW_FMT, s->pid, fd, s->role == ROLE_SERVER ? "server" : "client", l, p,
	       s->mode < 3 ? mode_names[s->mode] : "?", tx, rx, ring, fill, why);
}

static void print_rows(const struct rows *r, int json)
{
	char l[64], p[64];

	for (int i = 0; i < r->n; i++) {
		ep_format(&r->v[i].s.local, l, sizeof(l));
		ep_format(&r->v[i].s.peer, p, sizeof(p));
		if (json)
			print_row_json(&r->v[i], l, p, i == 0);
		else
			print_row_text(&r->v[i], l, p);
	}
}

/* ---- listeners ------------------------------------------------------------ */

struct listeners_out {
	const struct stat_opts *o;
	int n;
};

static void print_listener(const struct registry_listener *e, void *arg)
{
	struct listeners_out *lo = arg;
	char a[64], how[96];

	if ((lo->o->pid && e->pid != lo->o->pid) || (lo->o->port && e->addr.port != lo->o->port))
		return;
	ep_format(&e->addr, a, sizeof(a));
	if (lo->o->json) {
		printf("%s\n    {\"pid\": %d, \"local\": \"%s\", \"v6only\": %s, \"defer_accept\": %s, "
		       "\"inbox\": %s, \"direct\": %s}", lo->n ? "," : "", e->pid, a,
		       e->flags & LISTEN_F_V6ONLY ? "true" : "false",
		       e->flags & LISTEN_F_DEFER ? "true" : "false",
		       e->offer.inbox ? "true" : "false", e->offer.direct ? "true" : "false");
	} else {
		/* how smclo clients reach it (src/handshake/): an offer to its inbox, and
		 * without TCP at all while it waits in accept() */
		snprintf(how, sizeof(how), "listening%s%s%s%s",
		         e->offer.inbox ? ", inbox" : "", e->offer.direct ? ", direct" : "",
		         e->flags & LISTEN_F_DEFER ? ", defers accept" : "",
		         e->flags & LISTEN_F_V6ONLY ? ", v6only" : "");
		printf(ROW_FMT, e->pid, "-", "listen", a, "*", "-", "-", "-", "-", "-", how);
	}
	lo->n++;
}

/* ---- one listing, and --watch --------------------------------------------- */

static void print_listing(int dirfd, const char *dir, const struct stat_opts *o,
                          struct rows *r)
{
	struct listeners_out lo = { o, 0 };
	int conns = (o->kinds & ~KIND_LISTEN) != 0;

	if (conns)
		collect_rows(dirfd, r);
	if (o->json) {
		printf("{\"registry\": ");
		json_string(dir);
	} else {
		print_header();
	}
	if (o->kinds & KIND_LISTEN) {
		if (o->json)
			printf(", \"listeners\": [");
		registry_listeners_each(dirfd, print_listener, &lo);
		if (o->json)
			printf("%s]", lo.n ? "\n  " : "");
	}
	if (o->json)
		printf(", \"connections\": [");
	if (conns)
		print_rows(r, o->json);
	if (o->json)
		printf("%s]}\n", conns && r->n ? "\n  " : "");
}

static volatile sig_atomic_t stop_watch;

static void on_stop(int sig)
{
	(void)sig;
	stop_watch = 1;
}

/*
 * What comes before each listing: on a terminal, clear it and start at the
 * top (as watch(1)); elsewhere (a log, a pipe) a line with the time, so
 * the listings stay apart.  JSON gets no line: a reader takes one
 * document after another.
 */
static void watch_banner(const struct stat_opts *o, int tty)
{
	char when[64];
	time_t t = time(NULL);
	struct tm tm;

	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
	if (tty)
		printf("\033[H\033[2J");
	if (tty && !o->json)
		printf("every %gs: smclo stat (Ctrl-C stops)   %s\n\n", o->watch, when);
	else if (!o->json)
		printf("--- smclo stat %s\n", when);
}

/* Sleep @s seconds unless told to stop meanwhile. */
static void watch_sleep(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (time_t)s) * 1e9) };

	while (!stop_watch && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Refresh every o->watch seconds until interrupted (exit 0) or o->count listings. */
static int watch(int dirfd, const char *dir, struct stats_totals *tot,
                 const struct stat_opts *o, struct rows *r)
{
	struct sigaction sa = { .sa_handler = on_stop };        /* no SA_RESTART: wake the sleep */
	int tty = isatty(STDOUT_FILENO);

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	for (long n = 1; !stop_watch; n++) {
		if (n > 1)
			cli_registry_tidy(dirfd, tot);
		watch_banner(o, tty);
		print_listing(dirfd, dir, o, r);
		fflush(stdout);
		if (o->count && n >= o->count)
			break;
		watch_sleep(o->watch);
	}
	return 0;
}

int cmd_stat(int argc, char **argv)
{
	struct smclo_config c;
	struct stats_totals *tot;
	struct stat_opts o = { 0 };
	struct rows r = { .o = &o };
	int dirfd, rc;

	if ((rc = parse_stat_opts(argc, argv, &o)) || (rc = cli_registry_open(&c, &dirfd, &tot)))
		return rc;
	if (o.watch)
		rc = watch(dirfd, c.dir, tot, &o, &r);
	else
		print_listing(dirfd, c.dir, &o, &r);
	free(r.v);
	return rc;
}
