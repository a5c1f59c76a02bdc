/*
 * clc.c - encoding and validation of handshake messages (see clc.h).
 */
#include "clc.h"

#include "reason.h"
#include "ring.h"

#include <string.h>

size_t clc_size(enum clc_type type)
{
	switch (type) {
	case CLC_ACCEPT:
	case CLC_CONFIRM:  return sizeof(struct clc_accept);
	case CLC_DECLINE:  return sizeof(struct clc_decline);
	}
	return 0;
}

void clc_init(union clc_msg *m, enum clc_type type, uint64_t nonce)
{
	memset(m, 0, sizeof(*m));
	m->hdr.magic = CLC_MAGIC;
	m->hdr.type = (uint8_t)type;
	m->hdr.version = CLC_VERSION;
	m->hdr.length = (uint16_t)clc_size(type);
	m->hdr.nonce = nonce;
}

static int body_valid(const union clc_msg *m)
{
	switch (m->hdr.type) {
	case CLC_ACCEPT:
	case CLC_CONFIRM:
		return ring_size_valid(m->accept.ring_size) && ring_size_valid(m->accept.rx_max);
	case CLC_DECLINE:
		return m->decline.reason > R_NONE && m->decline.reason < R_COUNT;
	}
	return 0;
}

int clc_parse(const void *buf, size_t len, enum clc_type type, uint64_t nonce,
              union clc_msg *out)
{
	struct clc_hdr h;

	if (len < sizeof(h))
		return -1;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != CLC_MAGIC || h.version != CLC_VERSION)
		return -1;
	if (h.type != type && !(h.type == CLC_DECLINE &&
	                        (type == CLC_ACCEPT || type == CLC_CONFIRM)))
		return -1;
	if (h.length != clc_size(h.type) || len != h.length)
		return -1;
	if (nonce != 0 && h.nonce != nonce)
		return -1;
	memset(out, 0, sizeof(*out));
	memcpy(out, buf, len);
	return body_valid(out) ? 0 : -1;
}
