/*
 * test_clc.c - handshake messages: round trips, and rejection of truncated,
 * oversized, mistyped and out-of-range input, and of descriptors that do not
 * match the message.
 */
#include "check.h"
#include "clc.h"
#include "reason.h"

#include <dirent.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void accept_msg(union clc_msg *m)
{
	clc_init(m, CLC_ACCEPT, 42);
	m->accept.pid = 100;
	m->accept.ring_size = 256 << 10;
	m->accept.rx_max = 1 << 20;
	m->accept.netns = 0x1234;
}

static void test_roundtrip(void)
{
	union clc_msg m, out;

	accept_msg(&m);
	CHECK(clc_parse(&m, m.hdr.length, CLC_ACCEPT, 42, &out) == 0);
	CHECK(out.accept.pid == 100 && out.accept.netns == 0x1234);
	CHECK(out.accept.ring_size == 256 << 10);
	CHECK(clc_parse(&m, m.hdr.length, CLC_ACCEPT, 0, &out) == 0);     /* any nonce */

	clc_init(&m, CLC_CONFIRM, 9);
	m.accept.ring_size = 64 << 10;
	m.accept.rx_max = 64 << 10;
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 9, &out) == 0);
	CHECK(out.hdr.type == CLC_CONFIRM && out.accept.ring_size == 64 << 10);

	clc_init(&m, CLC_DECLINE, 9);
	m.decline.reason = R_IO_URING;
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 9, &out) == 0);   /* decline answers both */
	CHECK(out.hdr.type == CLC_DECLINE && out.decline.reason == R_IO_URING);
	CHECK(clc_parse(&m, m.hdr.length, CLC_ACCEPT, 9, &out) == 0);
	CHECK(clc_parse(&m, m.hdr.length, CLC_DECLINE, 9, &out) == 0);
}

static void test_truncated(void)
{
	union clc_msg m, out;

	accept_msg(&m);
	for (size_t len = 0; len < m.hdr.length; len++)
		CHECK(clc_parse(&m, len, CLC_ACCEPT, 42, &out) != 0);
	char big[sizeof(m) + 16] = { 0 };
	memcpy(big, &m, m.hdr.length);
	CHECK(clc_parse(big, (size_t)m.hdr.length + 1, CLC_ACCEPT, 42, &out) != 0);
}

static void test_malformed(void)
{
	union clc_msg m, out;

	accept_msg(&m);
	m.hdr.magic ^= 0x100;
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_ACCEPT, 42, &out) != 0);
	accept_msg(&m);
	m.hdr.version = 1;
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_ACCEPT, 42, &out) != 0);
	accept_msg(&m);
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_ACCEPT, 43, &out) != 0);   /* stale nonce */
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_CONFIRM, 42, &out) != 0);  /* wrong type */
	accept_msg(&m);
	m.hdr.length = 12;
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_ACCEPT, 42, &out) != 0);   /* length lies */
	accept_msg(&m);
	m.accept.rx_max = 12345;
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_ACCEPT, 42, &out) != 0);   /* bad ring size */
	accept_msg(&m);
	m.accept.ring_size = 64 << 20;
	CHECK(clc_parse(&m, sizeof(m.accept), CLC_ACCEPT, 42, &out) != 0);
	accept_msg(&m);
	m.hdr.type = 1;                                                      /* unknown type */
	CHECK(clc_parse(&m, sizeof(m.accept), 1, 42, &out) != 0);

	clc_init(&m, CLC_DECLINE, 1);
	m.decline.reason = R_COUNT;
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 1, &out) != 0);
	m.decline.reason = R_NONE;
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 1, &out) != 0);
	clc_init(&m, CLC_CONFIRM, 1);
	m.accept.ring_size = 0;
	m.accept.rx_max = 64 << 10;
	CHECK(clc_parse(&m, m.hdr.length, CLC_CONFIRM, 1, &out) != 0);
}

static void offer_msg(union clc_msg *m)
{
	clc_init(m, CLC_OFFER, 0);
	m->accept.pid = 7;
	m->accept.ring_size = 1 << 20;
	m->accept.rx_max = 1 << 20;
}

static void test_offer(void)
{
	union clc_msg m, out;

	offer_msg(&m);
	CHECK(clc_parse(&m, m.hdr.length, CLC_OFFER, 0, &out) == 0);
	CHECK(out.hdr.type == CLC_OFFER && out.accept.rx_max == 1 << 20);
	m.accept.ring_size = 3000;
	CHECK(clc_parse(&m, m.hdr.length, CLC_OFFER, 0, &out) != 0);
	clc_init(&m, CLC_DECLINE, 0);                   /* a decline is no offer */
	m.decline.reason = R_TIMEOUT;
	CHECK(clc_parse(&m, m.hdr.length, CLC_OFFER, 0, &out) != 0);
}

/* An offer without TCP: an offer's body, then the destination, which must name a port. */
static void test_direct(void)
{
	union clc_msg m, out;

	clc_init(&m, CLC_DIRECT, 0);
	m.accept.ring_size = 1 << 20;
	m.accept.rx_max = 1 << 16;
	m.direct.dst_ip[15] = 1;
	m.direct.dst_port = 6379;
	CHECK(m.hdr.length == sizeof(struct clc_direct) && m.hdr.length > sizeof(struct clc_accept));
	CHECK(clc_parse(&m, m.hdr.length, CLC_DIRECT, 0, &out) == 0);
	CHECK(out.direct.dst_port == 6379 && out.direct.dst_ip[15] == 1 &&
	      out.accept.rx_max == 1 << 16);
	CHECK(clc_parse(&m, m.hdr.length, CLC_OFFER, 0, &out) != 0);   /* not an inbox offer */
	CHECK(clc_parse(&m, sizeof(struct clc_accept), CLC_DIRECT, 0, &out) != 0);
	m.direct.dst_port = 0;
	CHECK(clc_parse(&m, m.hdr.length, CLC_DIRECT, 0, &out) != 0);
	m.direct.dst_port = 80;
	m.accept.ring_size = 3000;
	CHECK(clc_parse(&m, m.hdr.length, CLC_DIRECT, 0, &out) != 0);
}

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

/* Descriptors travel with a message, and a message with the wrong number is refused and its descriptors closed. */
static void test_recv_fds(void)
{
	union clc_msg m, out;
	struct clc_out o;
	int sp[2], fds[3] = { 0, 1, 2 }, got[3], before;

	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp) == 0);
	offer_msg(&m);
	CHECK(sendmsg(sp[0], clc_prepare(&o, &m, fds, 3), 0) == m.hdr.length);
	CHECK(clc_recv(sp[1], CLC_OFFER, 0, &out, got, 3) == 0);
	for (int i = 0; i < 3; i++)
		close(got[i]);
	before = open_fds();
	CHECK(sendmsg(sp[0], clc_prepare(&o, &m, fds, 2), 0) == m.hdr.length);
	CHECK(clc_recv(sp[1], CLC_OFFER, 0, &out, got, 3) != 0);
	CHECK(open_fds() == before);
	CHECK(clc_recv(sp[1], CLC_OFFER, 0, &out, got, 3) != 0);      /* nothing queued */
	close(sp[0]);
	close(sp[1]);
}

int main(void)
{
	test_roundtrip();
	test_truncated();
	test_malformed();
	test_offer();
	test_direct();
	test_recv_fds();
	return check_report("test_clc");
}
