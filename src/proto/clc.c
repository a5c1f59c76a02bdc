/*
 * clc.c - encoding and validation of handshake messages (see clc.h).
 */
#include "clc.h"

#include "reason.h"
#include "ring.h"

#include "sys.h"

#include <errno.h>
#include <string.h>

size_t clc_size(enum clc_type type)
{
	switch (type) {
	case CLC_ACCEPT:
	case CLC_CONFIRM:
	case CLC_OFFER:    return sizeof(struct clc_accept);
	case CLC_DIRECT:   return sizeof(struct clc_direct);
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
	case CLC_OFFER:
		return ring_size_valid(m->accept.ring_size) && ring_size_valid(m->accept.rx_max);
	case CLC_DIRECT:
		return ring_size_valid(m->accept.ring_size) && ring_size_valid(m->accept.rx_max) &&
		       m->direct.dst_port != 0;
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

struct msghdr *clc_prepare(struct clc_out *o, const union clc_msg *m, const int *fds, int nfds)
{
	memset(o, 0, sizeof(*o));
	o->iov.iov_base = (void *)m;
	o->iov.iov_len = m->hdr.length;
	o->mh.msg_iov = &o->iov;
	o->mh.msg_iovlen = 1;
	if (nfds) {
		struct cmsghdr *cm;
		o->mh.msg_control = o->cbuf;
		o->mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&o->mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	return &o->mh;
}

int clc_recv(int s, enum clc_type type, uint64_t nonce, union clc_msg *m, int *fds, int want)
{
	char buf[sizeof(union clc_msg) + 8];
	char cbuf[CMSG_SPACE((CLC_MAX_FDS + 1) * sizeof(int))];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
	                     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	int got[CLC_MAX_FDS + 1], ngot = 0;
	ssize_t n = sys_recvmsg(s, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0)
		return -1;
	/* descriptors first: whatever is rejected, what came with it is closed
	 * (an empty datagram carrying some leaked them: found by fuzz_clc_recv) */
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k && ngot < CLC_MAX_FDS + 1; i++)
			memcpy(&got[ngot++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	if (n == 0 || (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) ||
	    clc_parse(buf, (size_t)n, type, nonce, m) < 0 ||
	    ngot != (m->hdr.type == CLC_DECLINE ? 0 : want)) {
		sys_close_all(got, ngot);
		errno = EPROTO;
		return -1;
	}
	memcpy(fds, got, ngot * sizeof(int));
	return 0;
}
