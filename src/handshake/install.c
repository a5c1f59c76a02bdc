/*
 * install.c - the connection a handshake ends in, bound to the program's
 * descriptor: left on TCP with its reason, or on shared memory with its
 * region and shared state (the shm_parts the handshake gathered).
 */
#include "hs_internal.h"

#include "io.h"
#include "region.h"
#include "sys.h"

#include <fcntl.h>
#include <string.h>

/* @c named @l -> @r, with a row in this process's table (`smclo stat`) under @slot_fd. */
static void conn_listed(struct conn *c, int slot_fd, int role, const struct ep *l,
                        const struct ep *r)
{
	c->local = *l;
	c->peer = *r;
	c->slot = stats_slot_alloc(stats_table(registry_fd, NULL, 0), slot_fd, role);
	if (c->slot) {
		c->slot->local = *l;
		c->slot->peer = *r;
	}
}

/* A connection left on TCP: listed with its reason; SO_DOMAIN and the
 * rest are the real socket's own, so nothing else is looked up. */
struct conn *install_tcp(int fd, int role, int reason, const struct ep *l,
                             const struct ep *p)
{
	struct conn *c = conn_alloc(MODE_TCP);

	if (!c)
		return NULL;
	conn_listed(c, fd, role, l, p);
	stats_slot_decide(totals, c->slot, MODE_TCP, reason);
	fd_bind_conn(c, fd);
	conn_put(c);
	return c;
}

void install_parts_free(struct shm_parts *p)
{
	if (p->region)
		region_put(p->region, 0);
	if (p->sh)
		shared_put(p->sh, 0);
	memset(p, 0, sizeof(*p));
}

/*
 * A connection object for the shared memory in @p (taken over), not bound
 * yet; NULL (and @p left as it was) if there is no memory for one.
 */
struct conn *install_new_shm(int slot_fd, int role, struct shm_parts *p,
                                 const struct ep *l, const struct ep *r, int domain,
                                 int nonblock)
{
	struct conn *c = conn_alloc(MODE_SHM);

	if (!c)
		return NULL;
	c->domain = domain;
	c->region = p->region;
	if (role == ROLE_CLIENT) {
		c->tx = region_up(p->region);
		c->rx = region_down(p->region);
		c->tx_size = p->up;
		c->rx_size = p->down;
	} else {
		c->tx = region_down(p->region);
		c->rx = region_up(p->region);
		c->tx_size = p->down;
		c->rx_size = p->up;
	}
	c->sh = p->sh;
	c->direct = p->direct;
	c->sh->nonblock = nonblock;
	c->sh->rcvtimeo_ms = p->rcvtimeo_ms + 1;    /* known: no lookup at the first sleep */
	conn_listed(c, slot_fd, role, l, r);
	if (c->slot) {
		c->slot->tx_ring = c->tx_size;
		c->slot->rx_ring = c->rx_size;
	}
	memset(p, 0, sizeof(*p));
	return c;
}

/*
 * Under a small descriptor budget (fdtab.h, fd_budget_is_small), once @c is set
 * up: close its hidden TCP socket (names from the handshake, options on a
 * socket made on demand, as for a direct connection) and the region
 * descriptor it keeps (no reuse, no exec handover for it).
 */
int install_carry_signals(int from, int to, int hide)
{
	struct f_owner_ex own;
	int fl = sys_fcntl(from, F_GETFL, 0), sig = sys_fcntl(from, F_GETSIG, 0);

	if (sys_fcntl(from, F_GETOWN_EX, (long)&own) == 0 && own.pid)
		sys_fcntl(to, F_SETOWN_EX, (long)&own);
	if (sig > 0)
		sys_fcntl(to, F_SETSIG, sig);
	if (fl < 0 || !(fl & O_ASYNC))
		return 0;
	if (hide)
		sys_fcntl(from, F_SETFL, fl & ~O_ASYNC);
	fl = sys_fcntl(to, F_GETFL, 0);
	if (fl >= 0)
		sys_fcntl(to, F_SETFL, fl | O_ASYNC);
	return 1;
}

void install_go_lean(struct conn *c)
{
	if (!fd_budget_is_small())
		return;
	if (c->tcp_fd >= 0) {
		/* its addresses are the connection's: kept, then the socket goes,
		 * with a reset rather than a TIME_WAIT (the peer's copy is idle) */
		struct linger l = { .l_onoff = 1, .l_linger = 0 };

		ep_of_socket(c->tcp_fd, 0, &c->local);
		ep_of_socket(c->tcp_fd, 1, &c->peer);
		sys_setsockopt(c->tcp_fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
		sys_close(c->tcp_fd);
		c->tcp_fd = -1;
		c->direct = 1;          /* names from what we recorded, options on demand */
	}
	/* the peer must not move it to TCP: we could not follow (core/move.c) */
	atomic_store_explicit(&c->tx->no_tcp, 1, memory_order_release);
	if (c->region)
		region_drop_memfd(c->region);
}

/*
 * Bind the shared memory to @app_fd (the side connection's number from now
 * on) with @tcp_fd hidden beside it.
 */
void install_shm(int app_fd, int tcp_fd, int role, struct shm_parts *p,
                     const struct ep *l, const struct ep *r, int domain, int nonblock)
{
	int sndbuf = SIDE_SNDBUF;
	struct conn *c;

	sys_setsockopt(app_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	if (!(c = install_new_shm(app_fd, role, p, l, r, domain, nonblock))) {
		install_parts_free(p);  /* cannot happen in practice; keep the descriptor sane */
		return;
	}
	c->tcp_fd = tcp_fd;
	install_go_lean(c);
	stats_slot_decide(totals, c->slot, MODE_SHM, R_NONE);
	fd_bind_conn(c, app_fd);
	conn_put(c);
}
