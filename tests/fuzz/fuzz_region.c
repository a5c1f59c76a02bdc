/*
 * fuzz_region.c - a client's region as a server maps it: region_map()
 * (src/core/region.c), which checks the memfd's seals and size and both ring
 * headers (ring_hdr_check, src/proto/ring.c) before anything in it is used.
 *
 * Fuzzes: the ring sizes the offer claims (any 32-bit values), the memfd's
 * real length (exact, a page short or long, empty, any), the seals the
 * client put on it, and the fields of both ring headers that the checks
 * and a first read look at (magic, version, data size, header size,
 * producer and consumer cursors, flags); the headers are written where
 * the claimed sizes put them, when that lies inside the file.
 *
 * Input: [up size, 4][down size, 4][length mode][extra length, 4][seals]
 *        [up header fields][down header fields]
 *        [up, down header fields for the next connection]
 *
 * Asserts, besides ASan/UBSan:
 *  - a region is mapped only if both sizes are valid ring sizes, the file
 *    is exactly as long as they make it, it cannot shrink or grow (so no
 *    access to the mapping can SIGBUS) and both headers match;
 *  - then shrinking the file fails, the owner is our uid, both rings lie
 *    inside the mapping one after the other, and reading what each
 *    producer cursor claims - after ring_prod_valid() against a fresh
 *    consumer - stays inside its data area;
 *  - the same holds when the mapping is kept for the client's next
 *    connection (region_put reusable) and taken again after the client
 *    rewrote both headers (second set of header fields).
 */
#include "fuzz.h"

#include "region.h"
#include "stats.h"

#include <errno.h>
#include <sys/mman.h>

struct hdr_fields {
	uint32_t magic, version, data_size, hdr_size;
	uint64_t prod, cons;
	uint32_t flags;
};

static void take_hdr(struct in *in, struct hdr_fields *h)
{
	h->magic = take_u32(in);
	h->version = take_u32(in);
	h->data_size = take_u32(in);
	h->hdr_size = take_u32(in);
	h->prod = take_u64(in);
	h->cons = take_u64(in);
	h->flags = take_u32(in);
}

/* Write @h as a ring header at @off of @fd (what lies inside @len of it). */
static void put_hdr(int fd, uint64_t off, size_t len, const struct hdr_fields *h)
{
	struct ring_hdr r;

	if (off >= len)
		return;
	memset(&r, 0, sizeof(r));
	r.magic = h->magic;
	r.version = h->version;
	r.data_size = h->data_size;
	r.hdr_size = h->hdr_size;
	atomic_store(&r.prod, h->prod);
	atomic_store(&r.cons, h->cons);
	atomic_store(&r.flags, h->flags);
	pwrite(fd, &r, len - off < sizeof(r) ? len - off : sizeof(r), (off_t)off);
}

static int hdr_ok(const struct hdr_fields *h, uint32_t size)
{
	return h->magic == RING_MAGIC && h->version == RING_VERSION &&
	       h->hdr_size == RING_HDR_SIZE && h->data_size == size;
}

/* Read what the header says was produced, as a fresh reader would. */
static void read_claim(const struct ring_hdr *h, uint32_t size, const uint8_t *lo,
                       const uint8_t *hi)
{
	uint64_t prod = atomic_load(&h->prod);
	const uint8_t *data = (const uint8_t *)h + RING_HDR_SIZE;
	static uint8_t buf[RING_MAX_SIZE];

	FUZZ_CHECK((const uint8_t *)h >= lo && data + size <= hi);
	if (!ring_prod_valid(0, 0, prod, size))
		return;
	FUZZ_CHECK(prod <= size);
	ring_copy_out(buf, data, size, 0, (size_t)prod);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint32_t up = take_u32(&in), down = take_u32(&in);
	uint8_t lenmode = take_u8(&in);
	uint32_t extra = take_u32(&in);
	uint8_t seals = take_u8(&in);
	struct hdr_fields hu, hd, hu2, hd2;
	size_t exact = (size_t)RING_HDR_SIZE * 2 + up + down, len;
	int need = F_SEAL_SHRINK | F_SEAL_GROW, sealed = 0;
	struct region *r;
	uid_t owner = (uid_t)-1;
	int fd;

	take_hdr(&in, &hu);
	take_hdr(&in, &hd);
	take_hdr(&in, &hu2);
	take_hdr(&in, &hd2);
	/* sizes the fuzzer reaches easily: a small power of two (valid or not) */
	if (lenmode & 0x80) {
		up = 1u << (up % 26);
		down = 1u << (down % 26);
		exact = (size_t)RING_HDR_SIZE * 2 + up + down;
	}
	switch (lenmode & 7) {
	case 0: case 1: case 2: len = exact; break;
	case 3: len = exact > 4096 ? exact - 4096 : 0; break;
	case 4: len = exact + 4096; break;
	case 5: len = 0; break;
	case 6: len = exact - (exact > 0) ; break;
	default: len = extra % (2 * RING_MAX_SIZE + 2 * RING_HDR_SIZE + 1); break;
	}
	/* a file of more than both largest rings is refused by the size checks
	 * anyway; do not make one */
	if (len > 2 * (size_t)RING_MAX_SIZE + 2 * RING_HDR_SIZE + 4096)
		return 0;
	fd = memfd_create("fuzz-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	FUZZ_CHECK(fd >= 0);
	FUZZ_CHECK(ftruncate(fd, (off_t)len) == 0);
	put_hdr(fd, 0, len, &hu);
	put_hdr(fd, ring_region_len(up), len, &hd);
	{
		int s = (seals & 1 ? F_SEAL_SHRINK : 0) | (seals & 2 ? F_SEAL_GROW : 0) |
		        (seals & 4 ? F_SEAL_SEAL : 0) | (seals & 8 ? F_SEAL_WRITE : 0);
		if (s && fcntl(fd, F_ADD_SEALS, s) == 0)
			sealed = s;
	}

	r = region_map(fd, up, down, &owner);
	if (r) {
		const uint8_t *lo = (const uint8_t *)region_up(r), *hi = lo + exact;

		FUZZ_CHECK(ring_size_valid(up) && ring_size_valid(down));
		FUZZ_CHECK(len == exact);
		FUZZ_CHECK((sealed & need) == need);
		FUZZ_CHECK(hdr_ok(&hu, up) && hdr_ok(&hd, down));
		FUZZ_CHECK(owner == geteuid());
		/* the peer cannot take the pages away under us any more */
		FUZZ_CHECK(ftruncate(fd, 0) < 0 && errno == EPERM);
		FUZZ_CHECK((const uint8_t *)region_down(r) == lo + ring_region_len(up));
		read_claim(region_up(r), up, lo, hi);
		read_claim(region_down(r), down, lo, hi);
		if (seals & 0x10) {
			/* kept for the next connection, whose headers the client rewrote */
			struct region *again;

			region_put(r, 1);
			put_hdr(fd, 0, len, &hu2);
			put_hdr(fd, ring_region_len(up), len, &hd2);
			again = region_map(fd, up, down, &owner);
			if (!again) {
				FUZZ_CHECK(!(hdr_ok(&hu2, up) && hdr_ok(&hd2, down)));
				close(fd);
				return 0;
			}
			FUZZ_CHECK(again == r);         /* the mapping we kept */
			FUZZ_CHECK(hdr_ok(&hu2, up) && hdr_ok(&hd2, down));
			read_claim(region_up(r), up, lo, hi);
			read_claim(region_down(r), down, lo, hi);
		}
		region_put(r, 0);
	} else if (ring_size_valid(up) && ring_size_valid(down) && len == exact &&
	           (sealed & (need | F_SEAL_SEAL)) == (need | F_SEAL_SEAL) &&
	           hdr_ok(&hu, up) && hdr_ok(&hd, down)) {
		/* everything as a client of ours makes it: must be taken (F_SEAL_WRITE
		 * aside, which a real client never sets, mmap refuses it shared) */
		FUZZ_CHECK(sealed & F_SEAL_WRITE);
	}
	close(fd);
	return 0;
}
