/*
 * test_ring.c - cursor arithmetic, validation of hostile cursors, and copies
 * across the wrap of the data area and of the 64-bit counters.
 */
#include "check.h"
#include "ring.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_sizes(void)
{
	CHECK(ring_size_valid(16 << 10));
	CHECK(ring_size_valid(1 << 20));
	CHECK(ring_size_valid(16 << 20));
	CHECK(!ring_size_valid(0));
	CHECK(!ring_size_valid(8 << 10));
	CHECK(!ring_size_valid((64 << 10) + 1));
	CHECK(!ring_size_valid(32 << 20));
	CHECK(ring_size_round(1) == 16 << 10);
	CHECK(ring_size_round(100 << 10) == 128 << 10);
	CHECK(ring_size_round(1ull << 40) == RING_MAX_SIZE);
}

static void test_prod_validation(void)
{
	const uint32_t size = 64 << 10;

	CHECK(ring_prod_valid(0, 0, 0, size));
	CHECK(ring_prod_valid(0, 0, size, size));          /* exactly full */
	CHECK(!ring_prod_valid(0, 0, size + 1, size));     /* overfull */
	CHECK(!ring_prod_valid(100, 200, 150, size));      /* went backwards */
	CHECK(!ring_prod_valid(0, 0, UINT64_MAX, size));   /* "negative" */
	/* across the 64-bit wrap */
	uint64_t cons = UINT64_MAX - 10;
	CHECK(ring_prod_valid(cons, cons, cons + 20, size));
	CHECK(ring_prod_valid(cons, cons + 5, cons + size, size));
	CHECK(!ring_prod_valid(cons, cons, cons + size + 1, size));
	CHECK(!ring_prod_valid(cons, cons + 20, cons + 10, size));
}

/* A sealed producer cursor (core/move.c) is told from a live one anywhere
 * in the 64-bit range, and the cursor it seals comes back exactly. */
static void test_sealed_prod(void)
{
	const uint32_t size = 64 << 10;
	const uint64_t conses[] = { 0, 12345, UINT64_MAX - 10, (1ull << 63) - 5, 1ull << 63 };

	for (size_t i = 0; i < sizeof(conses) / sizeof(conses[0]); i++) {
		uint64_t cons = conses[i];

		for (uint64_t ahead = 0; ahead <= size; ahead += size / 4) {
			uint64_t prod = cons + ahead;

			CHECK(!ring_prod_sealed(prod, cons, size));
			CHECK(ring_prod_sealed(prod + RING_PROD_MOVED, cons, size));
			CHECK(prod + RING_PROD_MOVED - RING_PROD_MOVED == prod);
		}
		/* a cursor beyond what the ring can hold is neither: it fails validation */
		CHECK(!ring_prod_sealed(cons + size + 1 + RING_PROD_MOVED, cons, size));
		CHECK(!ring_prod_valid(cons, cons, cons + size + 1, size));
	}
}

static void test_cons_validation(void)
{
	CHECK(ring_cons_valid(0, 0, 0));
	CHECK(ring_cons_valid(0, 50, 100));
	CHECK(ring_cons_valid(0, 100, 100));
	CHECK(!ring_cons_valid(0, 101, 100));              /* consumed unwritten bytes */
	CHECK(!ring_cons_valid(50, 40, 100));              /* went backwards */
	uint64_t base = UINT64_MAX - 3;
	CHECK(ring_cons_valid(base, base + 2, base + 8));
	CHECK(ring_cons_valid(base, base + 8, base + 8));
	CHECK(!ring_cons_valid(base, base + 9, base + 8));
	CHECK(!ring_cons_valid(base, base - 1, base + 8));
}

static void test_space(void)
{
	CHECK(ring_space(0, 0, 1024) == 1024);
	CHECK(ring_space(1024, 0, 1024) == 0);
	CHECK(ring_space(UINT64_MAX, UINT64_MAX - 100, 1024) == 924);
	CHECK(ring_space(5, UINT64_MAX - 4, 1024) == 1014);  /* 10 bytes across the wrap */
}

/* Stream bytes through a tiny ring in uneven chunks, positions crossing both wraps. */
static void test_copy_wrap(void)
{
	const uint32_t size = 16 << 10;
	uint8_t *data = calloc(1, size);
	uint8_t *src = malloc(1 << 20), *dst = malloc(1 << 20);
	uint64_t prod = UINT64_MAX - 3000, cons = prod;
	size_t in = 0, out = 0, total = 1 << 20;
	unsigned seed = 7;

	for (size_t i = 0; i < total; i++)
		src[i] = (uint8_t)rand_r(&seed);
	while (out < total) {
		size_t n = (size_t)(rand_r(&seed) % 9000) + 1;
		uint32_t space = ring_space(prod, cons, size);
		if (n > space) n = space;
		if (n > total - in) n = total - in;
		ring_copy_in(data, size, prod, src + in, n);
		prod += n;
		in += n;
		size_t m = (size_t)(rand_r(&seed) % 9000) + 1;
		if (m > prod - cons) m = prod - cons;
		ring_copy_out(dst + out, data, size, cons, m);
		cons += m;
		out += m;
	}
	CHECK(memcmp(src, dst, total) == 0);
	CHECK(prod == cons);
	CHECK(prod < 3000 + total);    /* the counter wrapped */
	CHECK(ring_contig(size, size - 10, 100) == 10);
	CHECK(ring_contig(size, 0, 100) == 100);
	free(data);
	free(src);
	free(dst);
}

static void test_header(void)
{
	static _Alignas(64) uint8_t page[RING_HDR_SIZE];
	struct ring_hdr *h = (struct ring_hdr *)page;

	ring_hdr_init(h, 64 << 10);
	CHECK(ring_hdr_check(h, 64 << 10) == 0);
	CHECK(ring_hdr_check(h, 128 << 10) != 0);    /* size other than negotiated */
	h->magic ^= 1;
	CHECK(ring_hdr_check(h, 64 << 10) != 0);
	ring_hdr_init(h, 64 << 10);
	h->version = 99;
	CHECK(ring_hdr_check(h, 64 << 10) != 0);
	ring_hdr_init(h, 64 << 10);
	h->hdr_size = 0;
	CHECK(ring_hdr_check(h, 64 << 10) != 0);
}

/* A pool reference read from a hostile peer: only what names our pool and
 * lies ahead of our cursor, within what was produced, is ever used. */
static void test_ref_check(void)
{
	const uint64_t pool = 1 << 20;
	uint64_t cons = 1000, prod = 1100;

	/* next in line, whole, partly taken */
	CHECK(ring_ref_check(1000, 0, 4096, cons, 0, prod, pool) == REF_HERE);
	CHECK(ring_ref_check(1000, 0, 4096, cons, 4095, prod, pool) == REF_HERE);
	CHECK(ring_ref_check(1000, pool - 4096, 4096, cons, 0, prod, pool) == REF_HERE);
	/* plain bytes first; its placeholder not produced yet */
	CHECK(ring_ref_check(1050, 0, 4096, cons, 0, prod, pool) == REF_AHEAD);
	CHECK(ring_ref_check(1100, 0, 4096, cons, 0, prod, pool) == REF_LATER);
	/* forged: behind us, absurdly far ahead, empty, out of the pool,
	 * overflowing offset + length, no pool mapped, taken past its end */
	CHECK(ring_ref_check(999, 0, 4096, cons, 0, prod, pool) == REF_BAD);
	CHECK(ring_ref_check(cons + (1ull << 40), 0, 1, cons, 0, prod, pool) == REF_BAD);
	CHECK(ring_ref_check(1000, 0, 0, cons, 0, prod, pool) == REF_BAD);
	CHECK(ring_ref_check(1000, pool - 4095, 4096, cons, 0, prod, pool) == REF_BAD);
	CHECK(ring_ref_check(1000, UINT32_MAX, UINT32_MAX, cons, 0, prod, pool) == REF_BAD);
	CHECK(ring_ref_check(1000, 0, 4096, cons, 0, prod, 0) == REF_BAD);
	CHECK(ring_ref_check(1000, 0, 4096, cons, 4096, prod, pool) == REF_BAD);
	/* we are inside a reference at our cursor: it cannot have moved */
	CHECK(ring_ref_check(1050, 0, 4096, cons, 10, prod, pool) == REF_BAD);
	CHECK(ring_ref_check(1100, 0, 4096, cons, 10, prod, pool) == REF_BAD);
	/* cursors near the 2^64 wrap */
	cons = UINT64_MAX - 10;
	prod = cons + 100;
	CHECK(ring_ref_check(cons, 0, 10, cons, 0, prod, pool) == REF_HERE);
	CHECK(ring_ref_check(cons + 20, 0, 10, cons, 0, prod, pool) == REF_AHEAD);
	CHECK(ring_ref_check(cons - 1, 0, 10, cons, 0, prod, pool) == REF_BAD);
}

int main(void)
{
	test_sizes();
	test_prod_validation();
	test_sealed_prod();
	test_cons_validation();
	test_space();
	test_copy_wrap();
	test_header();
	test_ref_check();
	return check_report("test_ring");
}
