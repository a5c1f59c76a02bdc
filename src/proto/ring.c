/*
 * ring.c - cursor arithmetic and copies for the per-direction ring.
 *
 * Kept free of system calls so the unit tests can drive it with hostile and
 * wrapping cursor values.
 */
#include "ring.h"

#include <string.h>

int ring_size_valid(uint64_t size)
{
	return size >= RING_MIN_SIZE && size <= RING_MAX_SIZE &&
	       (size & (size - 1)) == 0;
}

uint32_t ring_size_round(uint64_t size)
{
	uint64_t s = RING_MIN_SIZE;

	while (s < size && s < RING_MAX_SIZE)
		s <<= 1;
	return (uint32_t)s;
}

void ring_hdr_init(struct ring_hdr *h, uint32_t size)
{
	memset(h, 0, sizeof(*h));
	h->magic = RING_MAGIC;
	h->version = RING_VERSION;
	h->data_size = size;
	h->hdr_size = RING_HDR_SIZE;
}

int ring_hdr_check(const struct ring_hdr *h, uint32_t expect_size)
{
	if (h->magic != RING_MAGIC || h->version != RING_VERSION)
		return -1;
	if (h->hdr_size != RING_HDR_SIZE || h->data_size != expect_size)
		return -1;
	return ring_size_valid(expect_size) ? 0 : -1;
}

int ring_prod_valid(uint64_t cons, uint64_t last_prod, uint64_t prod, uint32_t size)
{
	/* Unsigned differences stay correct across the 2^64 wrap. */
	if (prod - last_prod > (uint64_t)size)
		return 0;               /* moved backwards or jumped too far */
	return prod - cons <= (uint64_t)size;
}

int ring_cons_valid(uint64_t last_cons, uint64_t peer_cons, uint64_t prod)
{
	return peer_cons - last_cons <= prod - last_cons;
}

enum ref_state ring_ref_check(uint64_t pos, uint32_t off, uint32_t len, uint64_t cons,
                              uint32_t skip, uint64_t prod, uint64_t pool_len)
{
	if (skip && pos != cons)
		return REF_BAD;         /* we are inside the reference at @cons */
	if (pos - cons >= prod - cons)
		/* at or past the producer (honest: the placeholder is being
		 * written), or behind our cursor (wrapped: forged) */
		return pos - cons <= (uint64_t)RING_MAX_SIZE ? REF_LATER : REF_BAD;
	if (pos != cons)
		return REF_AHEAD;
	if (len == 0 || skip >= len || (uint64_t)off + len > pool_len)
		return REF_BAD;
	return REF_HERE;
}

void ring_copy_in(uint8_t *data, uint32_t size, uint64_t pos, const void *src, size_t len)
{
	size_t first = ring_contig(size, pos, len);

	memcpy(data + (pos & (size - 1)), src, first);
	if (len > first)
		memcpy(data, (const uint8_t *)src + first, len - first);
}

void ring_copy_out(void *dst, const uint8_t *data, uint32_t size, uint64_t pos, size_t len)
{
	size_t first = ring_contig(size, pos, len);

	memcpy(dst, data + (pos & (size - 1)), first);
	if (len > first)
		memcpy((uint8_t *)dst + first, data, len - first);
}
