/*
 * test_fdtab.c - the descriptor table (fd/fdtab.c, fd/fdfork.c), one
 * behaviour each: before the table exists every question gets the answer
 * "nothing known" (the handshake may ask from another library's constructor,
 * or with SMCLO_DISABLE, when there is no table); flags set, added and
 * cleared, and nothing outside the table; epoll registrations before
 * connect() counted; a listener's registry lock kept and taken once; threads
 * in accept() counted; a connection bound to two descriptors is held by
 * both, a lookup takes a reference and unbinding hands one back; a bind over
 * a bound descriptor lets the old connection go (dup2); a walk visits every
 * bound descriptor; smclo's own descriptors move above the program's range
 * and are let go again; a small RLIMIT_NOFILE is a small budget; a fork
 * counts the child as one more holder before it exists, a failed fork takes
 * the count back, and a child counts a connection bound while it was made.
 */
#include "check.h"

#include "world.h"
#include "fdtab.h"

#include <fcntl.h>
#include <sys/resource.h>

static void count_bound(int fd, struct conn *c, void *arg)
{
	(*(int *)arg)++;
}

static int bound(void)
{
	int n = 0;

	fd_for_each_conn(count_bound, &n);
	return n;
}

static void test_nothing_known_before_the_table(void)
{
	CHECK(fd_flags(5) == 0);
	fd_set_flags(5, FDF_TCP);               /* no table: nowhere to write, no crash */
	CHECK(fd_flags(5) == 0);
	CHECK(fd_get_conn(5) == NULL && !fd_has_conn(5));
	CHECK(fd_take_listen_lock(5) == -1);
	CHECK(fd_kernel_accepts(5, 1) == 0);
	CHECK(fd_epoll_early_count(5) == 0);
	CHECK(bound() == 0);
	CHECK(!fd_budget_is_small());
}

static void test_flags(void)
{
	fd_set_flags(7, FDF_TCP | FDF_KNOWN);
	fd_add_flags(7, FDF_LISTENING);
	CHECK(fd_flags(7) == (FDF_TCP | FDF_KNOWN | FDF_LISTENING));
	fd_set_flags(7, 0);
	CHECK(fd_flags(7) == 0);
	CHECK(fd_flags(-1) == 0 && fd_flags(fdtab_size) == 0);
	fd_set_flags(fdtab_size, FDF_TCP);      /* beyond the table: ignored */
	CHECK(fd_entry(fdtab_size) == NULL);
}

static void test_epoll_early(void)
{
	fd_epoll_early(9, 1);
	fd_epoll_early(9, 1);
	CHECK(fd_epoll_early_count(9) == 2);
	fd_epoll_early(9, -1);
	CHECK(fd_epoll_early_count(9) == 1);
	fd_epoll_early(9, 0);                   /* closed: all forgotten */
	CHECK(fd_epoll_early_count(9) == 0);
	fd_epoll_early(9, -1);                  /* never below zero */
	CHECK(fd_epoll_early_count(9) == 0);
}

static void test_listener_state(void)
{
	fd_set_listen_lock(9, 42);
	CHECK(fd_take_listen_lock(9) == 42);
	CHECK(fd_take_listen_lock(9) == -1);    /* taken: forgotten */
	CHECK(fd_kernel_accepts(9, 1) == 1);
	CHECK(fd_kernel_accepts(9, 1) == 2);
	CHECK(fd_kernel_accepts(9, 0) == 2);
	CHECK(fd_kernel_accepts(9, -1) == 1);
}

static void test_binding(void)
{
	struct world *w = world();
	int d = dup(w->fd);
	struct conn *c;

	fd_bind_conn(&w->c, w->fd);
	CHECK(fd_has_conn(w->fd) && w->c.fd_count == 1 && w->c.refs == 2);
	c = fd_get_conn(w->fd);
	CHECK(c == &w->c && w->c.refs == 3);
	conn_put(c);
	fd_bind_conn(&w->c, d);                 /* dup(): one more holder */
	CHECK(w->c.fd_count == 2 && w->c.refs == 3 && fd_get_conn(d) == &w->c);
	conn_put(&w->c);
	CHECK(bound() == 2);
	c = fd_unbind_conn(d);                  /* the reference comes with it */
	CHECK(c == &w->c && w->c.fd_count == 1 && !fd_has_conn(d));
	conn_put(c);
	CHECK(bound() == 1);
	CHECK(fd_unbind_conn(w->fd) == &w->c && w->c.fd_count == 0);
	conn_put(&w->c);
	CHECK(w->c.refs == 1 && bound() == 0);
	close(d);
	done(w);
}

static void test_bind_over_a_bound_descriptor(void)
{
	struct world *a = world(), *b = world();

	fd_bind_conn(&a->c, a->fd);
	fd_bind_conn(&b->c, a->fd);             /* dup2 over it: a's descriptor is gone */
	CHECK(a->c.fd_count == 0 && a->c.refs == 1);
	CHECK(fd_get_conn(a->fd) == &b->c && b->c.refs == 3);
	conn_put(&b->c);
	conn_put(fd_unbind_conn(a->fd));
	CHECK(b->c.refs == 1);
	done(a);
	done(b);
}

static void test_own_descriptors(void)
{
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	int h = fd_hide(s);

	CHECK(h >= 0 && fd_is_hidden(h) && fd_is_ours(h));
	CHECK(fcntl(h, F_GETFD) & FD_CLOEXEC);
	CHECK(fcntl(s, F_GETFD) < 0 || s == h);         /* moved, not copied */
	CHECK(fd_next_ours(0, (unsigned)fdtab_size - 1) == h);
	fd_forget_ours(h);                      /* smclo moves or closes it itself now */
	CHECK(!fd_is_ours(h));
	close(h);
}

static void test_budget(void)
{
	struct rlimit old, small;

	getrlimit(RLIMIT_NOFILE, &old);
	small = (struct rlimit){ 256, old.rlim_max };
	CHECK(setrlimit(RLIMIT_NOFILE, &small) == 0);
	fd_limit_changed();
	CHECK(fd_budget_is_small() && fd_soft_limit == 256);
	setrlimit(RLIMIT_NOFILE, &old);
	fd_limit_changed();
	CHECK(!fd_budget_is_small() || old.rlim_cur < 512);
}

static void test_fork_counts_the_child(void)
{
	struct world *w = world(), *late = world();

	fdtab_activate();
	fd_bind_conn(&w->c, w->fd);
	fdfork_begin();                         /* a fork that fails */
	fdfork_prepare();
	CHECK(w->sh.holders == 2 && w->c.refs == 3);    /* counted and held across it */
	fdfork_end(1);
	CHECK(w->sh.holders == 1 && w->c.refs == 2);
	fdfork_begin();                         /* one that makes a child */
	fdfork_prepare();
	fdfork_end(0);
	CHECK(w->sh.holders == 2 && w->c.refs == 2);
	fdfork_prepare();                       /* in the child: bound meanwhile, counted there */
	fd_bind_conn(&late->c, late->fd);
	fdfork_child();
	CHECK(late->sh.holders == 2 && late->c.inherited);
	CHECK(w->sh.holders == 3);              /* by the prepare, not again by the child */
	smclo_active = 0;
	conn_put(fd_unbind_conn(late->fd));
	conn_put(fd_unbind_conn(w->fd));
	done(w);
	done(late);
}

int main(void)
{
	test_nothing_known_before_the_table();
	CHECK(fdtab_init() == 0);
	test_flags();
	test_epoll_early();
	test_listener_state();
	test_binding();
	test_bind_over_a_bound_descriptor();
	test_own_descriptors();
	test_budget();
	test_fork_counts_the_child();
	return check_report("test_fdtab");
}
