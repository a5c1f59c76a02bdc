/*
 * iov.h - pieces of a vector of buffers (struct iovec): its size, its
 * first bytes, what follows its first bytes.  A write split between TCP
 * and a ring (handshake/client.c), a read answered partly by a ring and
 * partly by TCP (shim/io.c).
 */
#ifndef SMCLO_IOV_H
#define SMCLO_IOV_H

#include <stddef.h>
#include <sys/uio.h>

static inline size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* The first @max bytes of @iov (@n entries) as @out (at most @out_max
 * entries); how many entries. */
static inline int iov_head(const struct iovec *iov, int n, size_t max, struct iovec *out,
                           int out_max)
{
	int k = 0;

	for (int i = 0; i < n && max > 0 && k < out_max; i++, k++) {
		out[k] = iov[i];
		if (out[k].iov_len > max)
			out[k].iov_len = max;
		max -= out[k].iov_len;
	}
	return k;
}

/* @iov (@n entries) past its first @skip bytes, as @out (at most @out_max
 * entries: the rest is left out); how many entries. */
static inline int iov_tail(const struct iovec *iov, int n, size_t skip, struct iovec *out,
                           int out_max)
{
	int k = 0;

	for (int i = 0; i < n && k < out_max; i++) {
		if (skip >= iov[i].iov_len) {
			skip -= iov[i].iov_len;
			continue;
		}
		out[k].iov_base = (char *)iov[i].iov_base + skip;
		out[k++].iov_len = iov[i].iov_len - skip;
		skip = 0;
	}
	return k;
}

#endif
