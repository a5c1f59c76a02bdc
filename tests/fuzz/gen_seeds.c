/*
 * gen_seeds.c - writes the seed corpus of every harness: a handful of
 * valid inputs each, laid out with the project's own structures so they
 * follow its message, header and file formats.
 *
 *   tests/fuzz/run.sh --seeds        (builds this and runs it)
 *   gen_seeds <corpus dir>           (writes <dir>/<harness>/seed-*)
 *
 * Each harness's input layout is described at the top of its file.
 */
#include "addr.h"
#include "clc.h"
#include "reason.h"
#include "registry.h"
#include "ring.h"
#include "stats.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *root;

struct buf {
	uint8_t b[8192];
	size_t n;
};

static void put(struct buf *b, const void *p, size_t n)
{
	if (b->n + n > sizeof(b->b))
		abort();
	memcpy(b->b + b->n, p, n);
	b->n += n;
}

static void put8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void put16(struct buf *b, uint16_t v) { put(b, &v, 2); }
static void put32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put64(struct buf *b, uint64_t v) { put(b, &v, 8); }

static void save(const char *harness, const char *name, const struct buf *b)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, harness);
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/seed-%s", root, harness, name);
	f = fopen(path, "wb");
	if (!f || fwrite(b->b, 1, b->n, f) != b->n || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* ---- handshake messages ---- */

static void msg_accept(union clc_msg *m, enum clc_type t, uint64_t nonce)
{
	clc_init(m, t, nonce);
	m->accept.pid = 4321;
	m->accept.ring_size = 1u << 20;
	m->accept.rx_max = 1u << 20;
	m->accept.netns = 0x1000000000000001ull;
	if (t == CLC_DIRECT) {
		static const uint8_t lo[16] = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1 };
		memcpy(m->direct.dst_ip, lo, 16);
		m->direct.dst_port = 8080;
	}
}

static void msg_decline(union clc_msg *m, uint64_t nonce, int reason)
{
	clc_init(m, CLC_DECLINE, nonce);
	m->decline.reason = (uint32_t)reason;
}

/* fuzz_clc: [type index][nonce mode][nonce][message] */
static void seeds_clc(void)
{
	static const struct { const char *name; int idx; enum clc_type t; } s[] = {
		{ "accept", 0, CLC_ACCEPT }, { "confirm", 1, CLC_CONFIRM },
		{ "offer", 3, CLC_OFFER }, { "direct", 4, CLC_DIRECT },
	};
	union clc_msg m;

	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
		struct buf b = { .n = 0 };
		msg_accept(&m, s[i].t, 77);
		put8(&b, (uint8_t)s[i].idx);
		put8(&b, 1);
		put64(&b, 77);
		put(&b, &m, m.hdr.length);
		save("fuzz_clc", s[i].name, &b);
	}
	{
		struct buf b = { .n = 0 };
		msg_decline(&m, 9, R_DIFF_USER);
		put8(&b, 0);                    /* expecting ACCEPT, any nonce */
		put8(&b, 0);
		put64(&b, 0);
		put(&b, &m, m.hdr.length);
		save("fuzz_clc", "decline", &b);
	}
}

/* fuzz_clc_recv: [case][fd count and split][fd kinds][nonce][message] */
static void seeds_clc_recv(void)
{
	static const struct { const char *name; int c; enum clc_type t; int fds; } s[] = {
		{ "accept", 0, CLC_ACCEPT, 2 }, { "confirm", 1, CLC_CONFIRM, 2 },
		{ "offer", 2, CLC_OFFER, 3 }, { "direct", 3, CLC_DIRECT, 3 },
	};
	union clc_msg m;

	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
		struct buf b = { .n = 0 };
		msg_accept(&m, s[i].t, s[i].c == 1 ? 5 : 0);
		put8(&b, (uint8_t)s[i].c);
		put8(&b, (uint8_t)(s[i].fds | (i & 1) << 3));   /* odd ones: two SCM_RIGHTS blocks */
		put8(&b, 0xe4);                 /* kinds 0, 1, 2, 3 */
		put64(&b, 5);
		put(&b, &m, m.hdr.length);
		save("fuzz_clc_recv", s[i].name, &b);
	}
	{
		struct buf b = { .n = 0 };
		msg_decline(&m, 5, R_PROOF_FAILED);
		put8(&b, 1);                    /* expecting CONFIRM for nonce 5 */
		put8(&b, 0);
		put8(&b, 0);
		put64(&b, 5);
		put(&b, &m, m.hdr.length);
		save("fuzz_clc_recv", "decline", &b);
	}
}

/* ---- registry names ---- */

static void entry_name(char *out, size_t len, uint16_t port, uint64_t netns, const struct ep *ip,
                       unsigned flags, int pid, uint64_t inbox, uint64_t direct)
{
	char hex[33];

	ep_ip_hex(ip, hex);
	/* the format of registry_listener_add() */
	snprintf(out, len, "%u.%016llx.%s.%u.%d.%016llx.%016llx.%u.%u.%08llx", port,
	         (unsigned long long)netns, hex, flags, pid, (unsigned long long)inbox,
	         (unsigned long long)direct, 1u << 20, 1u << 20, 0x1234abcdull);
}

static void reg_query(struct buf *b, uint16_t port, const struct ep *dst, uint64_t netns,
                      uint8_t opt)
{
	put16(b, port);
	put(b, dst->ip, 16);
	put64(b, netns);
	put8(b, opt);
}

static void reg_line(struct buf *b, int live, const char *name)
{
	put8(b, (uint8_t)live);
	put(b, name, strlen(name));
	put8(b, '\n');
}

/* fuzz_registry: [port][ip][netns][options] then [live]name\n lines */
static void seeds_registry(void)
{
	struct ep lo = { .ip = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1 } };
	struct ep any4 = { .ip = { [10] = 0xff, [11] = 0xff } };
	struct ep any6 = { .ip = { 0 } };
	struct ep ten = { .ip = { [10] = 0xff, [11] = 0xff, [12] = 10, [15] = 7 } };
	uint64_t ns = 0x4000000000000003ull;
	char n1[256], n2[256];
	struct buf b;

	/* one process, its inbox: exclusive */
	b.n = 0;
	reg_query(&b, 8080, &lo, ns, 0);
	entry_name(n1, sizeof(n1), 8080, ns, &lo, 0, 100, 0xaaaa, 0);
	reg_line(&b, 1, n1);
	save("fuzz_registry", "exclusive", &b);

	/* the same process twice (wildcard and direct inbox): still exclusive */
	b.n = 0;
	reg_query(&b, 8080, &lo, ns, 1);
	entry_name(n1, sizeof(n1), 8080, ns, &any4, 0, 100, 0xaaaa, 0xbbbb);
	entry_name(n2, sizeof(n2), 8080, ns, &any6, LISTEN_F_V6ONLY, 100, 0xaaaa, 0xbbbb);
	reg_line(&b, 1, n1);
	reg_line(&b, 1, n2);
	save("fuzz_registry", "wildcards", &b);

	/* two processes (a fork child names no inbox): rendezvous */
	b.n = 0;
	reg_query(&b, 8080, &lo, ns, 0);
	entry_name(n1, sizeof(n1), 8080, ns, &lo, 0, 100, 0xaaaa, 0);
	entry_name(n2, sizeof(n2), 8080, ns, &lo, 0, 101, 0, 0);
	reg_line(&b, 1, n1);
	reg_line(&b, 1, n2);
	save("fuzz_registry", "two-processes", &b);

	/* another namespace, a defer listener, a dead entry; collected */
	b.n = 0;
	reg_query(&b, 443, &ten, ns, 1);
	entry_name(n1, sizeof(n1), 443, ns + 1, &ten, 0, 200, 0xcccc, 0);
	entry_name(n2, sizeof(n2), 443, ns, &any4, LISTEN_F_DEFER, 201, 0xdddd, 0);
	reg_line(&b, 1, n1);
	reg_line(&b, 0, n2);
	entry_name(n2, sizeof(n2), 443, ns, &ten, 0, 202, 0xeeee, 0);
	reg_line(&b, 0, n2);
	save("fuzz_registry", "netns-defer-dead", &b);

	/* the acceptor dropped privileges: its entry says unreachable */
	b.n = 0;
	reg_query(&b, 80, &lo, ns, 0);
	entry_name(n1, sizeof(n1), 80, ns, &any4, 0, 300, 0xabab, 0);
	entry_name(n2, sizeof(n2), 80, ns, &any4, LISTEN_F_UNREACHABLE, 300, 0xabab, 0);
	reg_line(&b, 1, n1);
	reg_line(&b, 1, n2);
	save("fuzz_registry", "unreachable", &b);
}

/* ---- the data path ---- */

enum { OP_PROD = 0, OP_CONS_ALL = 4, OP_FLAGS = 5, OP_BELLS = 6, OP_DOORBELL = 8,
       OP_SHUT = 10, OP_DRAIN = 12, OP_READ = 13, OP_WRITE = 14, OP_SENDFILE = 15,
       OP_AVAIL = 16, OP_SETTLE = 17 };

static void ring_exchange(struct buf *b)
{
	put8(b, OP_PROD); put32(b, 3000);               /* the peer wrote 3000 bytes */
	put8(b, OP_DOORBELL); put8(b, 1);               /* and rang */
	put8(b, OP_AVAIL);
	put8(b, OP_READ); put16(b, 1000); put8(b, 1); put8(b, 0);          /* peek 1000 */
	put8(b, OP_READ); put16(b, 4000); put8(b, 0); put8(b, 2); put8(b, 100); put8(b, 50);
	put8(b, OP_WRITE); put16(b, 5000); put8(b, 9); put8(b, 1); put8(b, 128);
	put8(b, OP_CONS_ALL);
	put8(b, OP_DRAIN);
	put8(b, OP_SENDFILE); put16(b, 20000); put16(b, 10);
	put8(b, OP_PROD); put32(b, 16384);              /* a full ring */
	put8(b, OP_READ); put16(b, 20000); put8(b, 2); put8(b, 0);        /* waitall */
	put8(b, OP_SETTLE);
	put8(b, OP_FLAGS); put32(b, RING_F_SHUTDOWN);
	put8(b, OP_SHUT);
	put8(b, OP_READ); put16(b, 100); put8(b, 0); put8(b, 0);
}

/* fuzz_ring: [options][header fields][start cursors][steps] */
static void seeds_ring(void)
{
	struct buf b;

	b.n = 0;
	put8(&b, 0);                    /* 16 KiB both ways, cursors at 0 */
	ring_exchange(&b);
	save("fuzz_ring", "exchange", &b);

	b.n = 0;
	put8(&b, 1 | 2 << 2 | 32 | 64);  /* 32 KiB in, 64 KiB out, cursors near 2^64, a slot */
	put64(&b, UINT64_MAX - 1000);
	put64(&b, UINT64_MAX - 20000);
	ring_exchange(&b);
	save("fuzz_ring", "wrap", &b);

	b.n = 0;
	put8(&b, 16);                   /* the peer's header, as it should be */
	put32(&b, RING_MAGIC);
	put32(&b, RING_VERSION);
	put32(&b, 16u << 10);
	put32(&b, RING_HDR_SIZE);
	put8(&b, OP_BELLS); put8(&b, 6); put8(&b, 0); put64(&b, 0); put8(&b, 0);
	ring_exchange(&b);
	save("fuzz_ring", "header", &b);
}

static void region_hdr(struct buf *b, uint32_t size, uint64_t prod)
{
	put32(b, RING_MAGIC);
	put32(b, RING_VERSION);
	put32(b, size);
	put32(b, RING_HDR_SIZE);
	put64(b, prod);
	put64(b, 0);
	put32(b, 0);
}

/* fuzz_region: [up][down][length mode][extra length][seals][up header][down header]
 * [next connection's up header][down header] */
static void seeds_region(void)
{
	struct buf b;

	b.n = 0;
	put32(&b, 16u << 10);
	put32(&b, 32u << 10);
	put8(&b, 0);                    /* exact length */
	put32(&b, 0);
	put8(&b, 7);                    /* shrink, grow, seal: as region.c seals */
	region_hdr(&b, 16u << 10, 100);
	region_hdr(&b, 32u << 10, 32u << 10);
	save("fuzz_region", "sealed", &b);

	b.n = 0;
	put32(&b, 32u << 10);
	put32(&b, 16u << 10);
	put8(&b, 0);
	put32(&b, 0);
	put8(&b, 0x17);                 /* sealed, and kept for a next connection */
	region_hdr(&b, 32u << 10, 5000);
	region_hdr(&b, 16u << 10, 0);
	region_hdr(&b, 32u << 10, 1u << 15);
	region_hdr(&b, 16u << 10, 77);
	save("fuzz_region", "kept", &b);

	b.n = 0;
	put32(&b, 14);                  /* 1 << 14 */
	put32(&b, 15);
	put8(&b, 0x80);
	put32(&b, 0);
	put8(&b, 3);                    /* never sealed against sealing */
	region_hdr(&b, 16u << 10, 0);
	region_hdr(&b, 32u << 10, 0);
	save("fuzz_region", "pow2", &b);
}

/* ---- statistics files ---- */

/* fuzz_stats: [options][table header][slot count][slots][totals file] */
static void seeds_stats(void)
{
	struct stat_table *t = calloc(1, sizeof(*t));
	struct stats_totals tot;
	struct ep lo = { .ip = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1 }, .port = 8080 };
	struct ep six = { .ip = { [15] = 1 }, .port = 40000 };

	t->magic = TABLE_MAGIC;
	t->pid = 4321;
	t->nslots = TABLE_SLOTS;
	for (int i = 0; i < 3; i++) {
		struct stat_slot *s = &t->slots[i];
		atomic_store(&s->in_use, 1);
		s->pid = 4321;
		s->fd = 5 + i;
		s->mode = (uint8_t)i;           /* pending, shm, tcp */
		s->role = (uint8_t)(i == 1 ? ROLE_SERVER : ROLE_CLIENT);
		s->reason = i == 2 ? R_TIMEOUT : R_NONE;
		s->local = i == 2 ? six : lo;
		s->peer = lo;
		s->tx_ring = s->rx_ring = 1u << 20;
		atomic_store(&s->tx_bytes, 1000u * i);
		atomic_store(&s->rx_bytes, 2000u * i);
	}
	memset(&tot, 0, sizeof(tot));
	tot.magic = STATS_MAGIC;
	tot.version = STATS_VERSION;
	tot.created = 1700000000;
	atomic_store(&tot.reset, 1700000000);
	atomic_store(&tot.accelerated[1], 5);
	atomic_store(&tot.fallback[R_TIMEOUT], 2);
	atomic_store(&tot.tx_bytes, 123456);

	for (int opt = 0; opt < 4; opt++) {
		static const char *names[] = { "dead-text", "live-text", "dead-json", "live-json" };
		struct buf b = { .n = 0 };

		put8(&b, (uint8_t)opt);
		put(&b, t, 16);
		put8(&b, 3);
		put(&b, t->slots, 3 * sizeof(struct stat_slot));
		put(&b, &tot, sizeof(tot));
		save("fuzz_stats", names[opt], &b);
	}
	free(t);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_seeds <corpus dir>\n");
		return 2;
	}
	root = argv[1];
	if (mkdir(root, 0755) < 0 && errno != EEXIST) {
		perror(root);
		return 1;
	}
	seeds_clc();
	seeds_clc_recv();
	seeds_registry();
	seeds_ring();
	seeds_region();
	seeds_stats();
	return 0;
}
