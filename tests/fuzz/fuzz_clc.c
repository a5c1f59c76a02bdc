/*
 * fuzz_clc.c - handshake messages as bytes: clc_parse() (src/proto/clc.c).
 *
 * Fuzzes: the validation every received handshake message goes through
 * before any field is used - ACCEPT, CONFIRM, DECLINE, OFFER and DIRECT -
 * with the type the caller expects and the nonce it expects (0: any) taken
 * from the input, and the message bytes (any length) after them.
 *
 * Input: [type index][nonce mode][nonce, 8 bytes][message bytes...]
 *
 * Asserts, besides ASan/UBSan finding no bad access:
 *  - an accepted message has exactly the length its type says, the magic,
 *    the version, the expected type (or a DECLINE where ACCEPT or CONFIRM is
 *    expected) and the expected nonce;
 *  - its ranges hold: ring sizes ring_size_valid(), a DIRECT names a port,
 *    a DECLINE's reason is a known reason (reason_id is not "unknown");
 *  - the copy handed back is the message, byte for byte, zero after it,
 *    and its header is what clc_init() would write for that type and nonce.
 */
#include "fuzz.h"

#include "clc.h"
#include "reason.h"
#include "ring.h"

static const enum clc_type types[] = {
	CLC_ACCEPT, CLC_CONFIRM, CLC_DECLINE, CLC_OFFER, CLC_DIRECT,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	enum clc_type type = types[take_u8(&in) % (sizeof(types) / sizeof(types[0]))];
	int nonce_mode = take_u8(&in);
	uint64_t nonce = take_u64(&in);
	union clc_msg out, hdr;
	uint8_t *msg;
	int rc;

	if (!(nonce_mode & 1))
		nonce = 0;              /* any nonce, as inbox offers are read */
	/* the message in a buffer of its own size: a read past it is reported */
	msg = malloc(in.n ? in.n : 1);
	memcpy(msg, in.p, in.n);
	rc = clc_parse(msg, in.n, type, nonce, &out);
	if (rc == 0) {
		size_t len = in.n;

		FUZZ_CHECK(len >= sizeof(struct clc_hdr));
		FUZZ_CHECK(out.hdr.magic == CLC_MAGIC && out.hdr.version == CLC_VERSION);
		FUZZ_CHECK(out.hdr.type == type ||
		           (out.hdr.type == CLC_DECLINE &&
		            (type == CLC_ACCEPT || type == CLC_CONFIRM)));
		FUZZ_CHECK(out.hdr.length == len && len == clc_size((enum clc_type)out.hdr.type));
		FUZZ_CHECK(len <= sizeof(out));
		FUZZ_CHECK(nonce == 0 || out.hdr.nonce == nonce);
		FUZZ_CHECK(memcmp(&out, msg, len) == 0);
		for (size_t i = len; i < sizeof(out); i++)
			FUZZ_CHECK(((const uint8_t *)&out)[i] == 0);
		clc_init(&hdr, (enum clc_type)out.hdr.type, out.hdr.nonce);
		FUZZ_CHECK(memcmp(&hdr.hdr, &out.hdr, sizeof(hdr.hdr)) == 0);
		switch (out.hdr.type) {
		case CLC_DIRECT:
			FUZZ_CHECK(out.direct.dst_port != 0);
			/* fall through */
		case CLC_ACCEPT:
		case CLC_CONFIRM:
		case CLC_OFFER:
			FUZZ_CHECK(ring_size_valid(out.accept.ring_size));
			FUZZ_CHECK(ring_size_valid(out.accept.rx_max));
			/* what the sides compute from them (client.c, server.c) stays a ring size */
			FUZZ_CHECK(ring_region_len(out.accept.ring_size) ==
			           RING_HDR_SIZE + (size_t)out.accept.ring_size);
			break;
		case CLC_DECLINE:
			FUZZ_CHECK(out.decline.reason > R_NONE && out.decline.reason < R_COUNT);
			FUZZ_CHECK(strcmp(reason_id((int)out.decline.reason), "unknown") != 0);
			FUZZ_CHECK(strcmp(reason_text((int)out.decline.reason), "unknown reason") != 0);
			break;
		default:
			FUZZ_CHECK(!"accepted a message of no known type");
		}
	} else {
		FUZZ_CHECK(rc == -1);
	}
	free(msg);
	return 0;
}
