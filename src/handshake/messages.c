/*
 * messages.c - the handshake's messages on the wire between the two
 * processes (their formats and checks are proto/clc.c's): sending one with
 * its descriptors, and receiving one within the handshake's deadline.
 */
#include "hs_internal.h"

#include "spin.h"

#include <errno.h>
#include <poll.h>

int hs_msg_wait_fd(int fd, short events, long deadline)
{
	if (deadline > mono_now_ms() && spin_poll(fd, events))
		return 0;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		long left = deadline - mono_now_ms();
		int rc;

		if (left < 0)
			left = 0;
		rc = sys_poll(&p, 1, (int)left);
		if (rc > 0)
			return 0;
		if (rc == 0 || errno != EINTR)
			return -1;
	}
}


int hs_msg_send(int s, const union clc_msg *m, const int *fds, int nfds)
{
	struct clc_out o;

	return sys_sendmsg(s, clc_prepare(&o, m, fds, nfds), MSG_NOSIGNAL) ==
	       (ssize_t)m->hdr.length ? 0 : -1;
}

/* clc_recv(), waiting until @deadline for the message to arrive. */
int hs_msg_recv(int s, enum clc_type type, uint64_t nonce, union clc_msg *m,
                    int *fds, int want, long deadline)
{
	if (hs_msg_wait_fd(s, POLLIN, deadline) < 0)
		return -1;
	return clc_recv(s, type, nonce, m, fds, want);
}

void hs_msg_decline_init(union clc_msg *m, uint64_t nonce, int reason)
{
	clc_init(m, CLC_DECLINE, nonce);
	m->decline.reason = (uint32_t)reason;
}
