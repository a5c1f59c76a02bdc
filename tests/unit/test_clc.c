/*
 * test_clc.c - handshake messages: round trips, and rejection of truncated,
 * oversized, mistyped and out-of-range input.
 */
#include "check.h"
#include "clc.h"
#include "reason.h"

#include <string.h>

static void proposal(union clc_msg *m)
{
	clc_init(m, CLC_PROPOSAL, 42);
	m->proposal.pid = 100;
	m->proposal.uid = 1000;
	m->proposal.rx_max = 64 << 10;
	m->proposal.tx_size = 64 << 10;
	m->proposal.netns = 0x1234;
	strcpy(m->proposal.side, "100.deadbeef-100");
}

static void test_roundtrip(void)
{
	union clc_msg m, out;

	proposal(&m);
	CHECK(clc_parse(&m, m.hdr.length, CLC_PROPOSAL, 42, &out) == 0);
	CHECK(out.proposal.pid == 100 && out.proposal.netns == 0x1234);
	CHECK(strcmp(out.proposal.side, "100.deadbeef-100") == 0);
	CHECK(clc_parse(&m, m.hdr.length, CLC_PROPOSAL, 0, &out) == 0);   /* any nonce */

	clc_init(&m, CLC_ACCEPT, 9);
	m.accept.ring_size = 256 << 10;
	m.accept.rx_max = 1 << 20;
	CHECK(clc_parse(&m, m.hdr.length, CLC_ACCEPT, 9, &out) == 0);
	CHECK(out.accept.ring_size == 256 << 10);

	clc_init(&m, CLC_DECLINE, 9);
	m.decline.reason = R_IO_URING;
	CHECK(clc_parse(&m, m.hdr.length, CLC_ACCEPT, 9, &out) == 0);   /* decline answers accept */
	CHECK(out.hdr.type == CLC_DECLINE && out.decline.reason == R_IO_URING);
	CHECK(clc_parse(&m, m.hdr.length, CLC_FINAL, 9, &out) == 0);
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 9, &out) != 0); /* but not confirm */
}

static void test_truncated(void)
{
	union clc_msg m, out;

	proposal(&m);
	for (size_t len = 0; len < m.hdr.length; len++)
		CHECK(clc_parse(&m, len, CLC_PROPOSAL, 42, &out) != 0);
	char big[sizeof(m) + 16] = { 0 };
	memcpy(big, &m, m.hdr.length);
	CHECK(clc_parse(big, (size_t)m.hdr.length + 1, CLC_PROPOSAL, 42, &out) != 0);
}

static void test_malformed(void)
{
	union clc_msg m, out;

	proposal(&m);
	m.hdr.magic ^= 0x100;
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);
	proposal(&m);
	m.hdr.version = 2;
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);
	proposal(&m);
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 43, &out) != 0);  /* stale nonce */
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_ACCEPT, 42, &out) != 0);    /* wrong type */
	proposal(&m);
	m.hdr.length = 12;
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);  /* length lies */
	proposal(&m);
	m.proposal.rx_max = 12345;
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);  /* bad ring size */
	proposal(&m);
	m.proposal.tx_size = 64 << 20;
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);
	proposal(&m);
	memset(m.proposal.side, 'a', sizeof(m.proposal.side));                  /* unterminated */
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);
	proposal(&m);
	strcpy(m.proposal.side, "../../etc/x");                                 /* path escape */
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);
	proposal(&m);
	m.proposal.side[0] = '\0';
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);
	proposal(&m);
	m.proposal.pid = 0;
	CHECK(clc_parse(&m, sizeof(m.proposal), CLC_PROPOSAL, 42, &out) != 0);

	clc_init(&m, CLC_DECLINE, 1);
	m.decline.reason = R_COUNT;
	CHECK(clc_parse(&m, m.hdr.length, CLC_DECLINE, 1, &out) != 0);
	m.decline.reason = R_NONE;
	CHECK(clc_parse(&m, m.hdr.length, CLC_DECLINE, 1, &out) != 0);
	clc_init(&m, CLC_FINAL, 1);
	m.final.ok = 7;
	CHECK(clc_parse(&m, m.hdr.length, CLC_FINAL, 1, &out) != 0);
	clc_init(&m, CLC_CONFIRM, 1);
	m.accept.ring_size = 0;
	m.accept.rx_max = 64 << 10;
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 1, &out) != 0);
}

int main(void)
{
	test_roundtrip();
	test_truncated();
	test_malformed();
	return check_report("test_clc");
}
