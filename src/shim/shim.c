/*
 * shim.c - the lookup behind shim_conn() (shim.h): the connection a
 * descriptor names, decided first if its handshake is still under way.
 */
#include "shim.h"

struct conn *shim_conn_lookup(int fd, size_t n, int flags)
{
	struct conn *c = fd_get_conn(fd);

	if (c && atomic_load_explicit(&c->pending, memory_order_relaxed) != PENDING_NONE) {
		int blocking = !(flags & (MSG_DONTWAIT | MSG_PEEK)) && !atomic_load(&c->sh->nonblock);
		/* every call but a small write needs the decision */
		hs_resolve(fd, c, blocking ? n : 0);
	}
	if (c && c->mode != MODE_SHM) {
		conn_put(c);
		return NULL;
	}
	return c;
}
