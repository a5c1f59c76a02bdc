/*
 * listener.c - a listener's entry in the registry: made at listen(),
 * marked unreachable before the process becomes a user who cannot use the
 * registry (or changes root), made anew in a fork child, removed at close.
 */
#include "hs_internal.h"

#include "io.h"
#include "registry.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/stat.h>
#include <unistd.h>

int hs_listen_bound(int fd)
{
	struct ep e;

	if (ep_of_socket(fd, 0, &e) < 0 || e.port == 0)
		return -1;
	hs_listen(fd);
	return (fd_flags(fd) & FDF_LISTENING) ? 0 : -1;
}

/*
 * This process is about to become a user who cannot use the registry (a
 * daemon dropping root after listen(), as nginx's workers do): while it
 * still can, every listener entry of its own says so, and clients use TCP
 * at once (no-registry) instead of waiting out their handshake timeout at
 * a rendezvous nobody here can see.
 */
static int registry_unreachable;

static void listener_mark_unreachable(int fd)
{
	struct listener_offer none = { 0 };
	int lock, old;

	hs_listener_no_direct(fd);      /* leaves direct, under direct.c's lock */
	if ((lock = listener_register(fd, &none)) < 0)
		return;
	old = fd_take_listen_lock(fd);
	fd_set_listen_lock(fd, lock);
	if (old >= 0)
		registry_lock_remove(registry_fd, "l", old);
}

static void listeners_unreachable(const char *why)
{
	if (registry_fd < 0 || registry_unreachable)
		return;
	registry_unreachable = 1;
	fd_for_each_listener(listener_mark_unreachable);
	DBG("%s: listeners marked for TCP", why);
}

void hs_listener_unserved(int fd)
{
	if (registry_fd < 0 || !(fd_flags(fd) & FDF_LISTENING))
		return;
	listener_mark_unreachable(fd);
	DBG("fd %d: accepts through io_uring: marked for TCP", fd);
}

void listeners_confined(void)
{
	listeners_unreachable("the process confines itself");
}

void hs_user_changing(uid_t euid)
{
	if (euid != (uid_t)-1 && euid != geteuid() && !registry_usable_by(euid))
		listeners_unreachable("the new effective uid cannot use the registry");
}

/*
 * After chroot(): a server answers a client's rendezvous through the path
 * /proc/self/fd/N/p/<key>, which a root without /proc does not have (the
 * inbox and direct handshakes need no path, but clients cannot tell which
 * they will get).  The entries are made again while the registry
 * directory, opened before, still takes them.
 */
void hs_chrooted(void)
{
	if (access("/proc/self/fd", X_OK) < 0)
		listeners_unreachable("no /proc in the new root");
}

/*
 * Would a client of another user believe an entry we wrote for listener
 * @fd now?  Only if we are root or own the socket (the kernel gives the
 * socket's owner as its inode's): after a privilege drop between socket()
 * and now, the entry made before the drop is the one to keep.
 */
int listener_entry_believed(int fd)
{
	struct stat st;

	return geteuid() == 0 || (fstat(fd, &st) == 0 && st.st_uid == geteuid());
}

int listener_register(int fd, const struct listener_offer *offer)
{
	struct ep e;
	unsigned flags = 0;
	int v = 0, lock;
	socklen_t l = sizeof(v);

	if (registry_fd < 0 || ep_of_socket(fd, 0, &e) < 0)
		return -1;
	if (sys_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, &l) == 0 && v)
		flags |= LISTEN_F_V6ONLY;
	v = 0;
	l = sizeof(v);
	if (sys_getsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, &l) == 0 && v)
		flags |= LISTEN_F_DEFER | LISTEN_F_PREFIX;
	if (registry_unreachable)
		flags |= LISTEN_F_UNREACHABLE;
	lock = registry_listener_add(registry_fd, &e, proof_netns_cookie(fd), flags, offer);
	if (lock >= 0)
		DBG("listen fd %d: registered port %u, inbox %llx", fd, e.port,
		    (unsigned long long)offer->inbox);
	return lock < 0 ? -1 : io_keep_fd(lock);
}

void hs_listen(int fd)
{
	struct listener_offer offer = { .inbox = inbox_id(), .tx_size = cfg.tx_size,
	                                .rx_max = cfg.rx_max };
	int lock;
	uint16_t f = fd_flags(fd);

	/*
	 * A server that can make neither an inbox nor the socket it answers
	 * rendezvous through (out of descriptors) could not take a client:
	 * unannounced, its clients use TCP at once instead of waiting.
	 */
	if (!offer.inbox && server_answer_sock() < 0)
		return;
	lock = listener_register(fd, &offer);
	if (lock < 0)
		return;
	fd_set_listen_lock(fd, lock);
	if (!(f & FDF_KNOWN) && proof_domain_of(fd) == AF_INET6)
		f |= FDF_INET6;         /* inherited: asked once, here */
	if (!(f & FDF_KNOWN))
		f |= FDF_TIMEOUTS;      /* and whatever options it came with, not known */
	fd_set_flags(fd, FDF_TCP | FDF_KNOWN | FDF_LISTENING |
	             (f & (FDF_SMC | FDF_INET6 | FDF_TIMEOUTS | FDF_NO_DIRECT)));
}

/*
 * This process's entry for listener @fd made again, naming @offer, as the
 * listener is now (its options read again); the old entry goes.  The
 * entry lives as long as the listener: across exec too when it survives it.
 */
static void listener_register_again(int fd, const struct listener_offer *offer)
{
	int old = fd_take_listen_lock(fd), lock = listener_register(fd, offer);

	if (old >= 0)
		sys_close(old);
	if (lock < 0)
		return;
	if (!(sys_fcntl(fd, F_GETFD, 0) & FD_CLOEXEC))
		sys_fcntl(lock, F_SETFD, 0);
	fd_set_listen_lock(fd, lock);
}

/*
 * The inbox a fork child names for a listener it inherited: the one it
 * inherited with the listener (inbox.c reads it, shared with the parent and
 * the other children, each offer parked for the child that accepts its
 * connection), so that every entry for the address names one inbox and a
 * client sends its offer to whichever process the kernel gives the
 * connection (apache2's children, nginx's workers, php-fpm's).  Not the
 * rendezvous: there a server that accepts waits for its client's confirm,
 * and an event loop's client (ab, wrk, a proxy) waits in connect() for the
 * server's answer - each side's loop held by the other's, per connection
 * (nginx with a worker, ab -c 20, a connection per request: 0.48x of TCP,
 * about 0.7x with the shared inbox).  0 if none.  @forking: called from the
 * fork child's handler (hs_after_fork).
 */
static int listener_inherited_inbox(int fd, int forking, struct listener_offer *offer)
{
	int pid = 0;
	uint64_t id = forking ? inbox_inherited_forking(&pid) : inbox_inherited(&pid);

	if (!id)
		return 0;
	*offer = (struct listener_offer){ .inbox = id, .inbox_pid = pid, .tx_size = cfg.tx_size,
	                                  .rx_max = cfg.rx_max };
	return 1;
}

/*
 * A fork child may accept on every listener it inherited: it adds an entry
 * of its own naming the shared inbox (or none, when the inbox could not be
 * shared: clients see that more than one process accepts there and use the
 * rendezvous).  The entry lives as long as the child holds the listener:
 * across exec too when the listener survives it, but without the inbox,
 * which does not (hs_listeners_before_exec).
 */
static int forked_named_inbox;       /* listener_forked named the inherited inbox */

static void listener_forked(int fd)
{
	/* the parent's direct inbox is not the child's (inbox.c drops the copy) */
	struct listener_offer offer = { 0 };

	fd_set_flags(fd, (fd_flags(fd) & ~FDF_DIRECT) | FDF_NO_DIRECT);
	forked_named_inbox |= listener_inherited_inbox(fd, 1, &offer);
	listener_register_again(fd, &offer);
}

/*
 * TCP_DEFER_ACCEPT set on listener @fd after listen(), here or in a process
 * sharing it: the entry says so, still naming our inbox (or the shared one).  A client sends
 * its first bytes over TCP with its offer when one process accepts here
 * (they wake it: server.c, server_tcp_prefix), and takes TCP at once
 * otherwise.  Never direct: the first bytes would have no TCP to go over.
 */
void hs_listener_defers(int fd)
{
	struct listener_offer offer;

	if (!(fd_flags(fd) & FDF_LISTENING))
		return;
	/* a fork child names the inbox it shares for a listener it inherited
	 * (FDF_NO_DIRECT: listener_forked marks those; a listener of its own
	 * marked so for another reason would name it too, which still works:
	 * the child reads the inbox it inherited as well as its own) */
	if (!((fd_flags(fd) & FDF_NO_DIRECT) && listener_inherited_inbox(fd, 0, &offer)))
		offer = (struct listener_offer){ .inbox = inbox_id(), .tx_size = cfg.tx_size,
		                                 .rx_max = cfg.rx_max };
	hs_listener_no_direct(fd);
	listener_register_again(fd, &offer);
	DBG("listen fd %d: accept deferred: first bytes over TCP", fd);
}

/*
 * Listener @fd will be held by another program too (an exec, a spawn): its
 * entry names the inbox this process shares with its parent, which that
 * program will not hold (close-on-exec), so an offer sent there for a
 * connection it accepts would wait for nobody to read it - a handshake
 * timeout, and the client's socket held open by the unread offer, its FIN
 * with it.  The entry is made again without an inbox: clients use the
 * rendezvous, which any acceptor answers (or TCP at once, where accept is
 * deferred), as for any other acceptor the registry cannot vouch for.
 */
static void listener_without_inherited_inbox(int fd)
{
	if (fd_flags(fd) & FDF_NO_DIRECT)
		listener_register_again(fd, &(struct listener_offer){ 0 });
}

/* Kept across the exec about to happen; an exec that fails leaves the entry
 * so: slower, never stalled. */
static void listener_before_exec(int fd)
{
	if (!(sys_fcntl(fd, F_GETFD, 0) & FD_CLOEXEC))
		listener_without_inherited_inbox(fd);
}

void hs_listeners_before_exec(void)
{
	int parent;

	if (inbox_inherited(&parent))
		fd_for_each_listener(listener_before_exec);
}

/* What hs_listeners_before_spawn asks of each listener (fd_for_each_listener
 * passes no context). */
static _Thread_local int (*spawn_keeps)(int fd, const void *ctx);
static _Thread_local const void *spawn_ctx;

static void listener_before_spawn(int fd)
{
	if (spawn_keeps(fd, spawn_ctx))
		listener_without_inherited_inbox(fd);
}

void hs_listeners_before_spawn(int (*keeps)(int fd, const void *ctx), const void *ctx)
{
	int parent;

	if (!inbox_inherited(&parent))
		return;
	spawn_keeps = keeps;
	spawn_ctx = ctx;
	fd_for_each_listener(listener_before_spawn);
}

void hs_after_fork(void)
{
	forked_named_inbox = 0;
	fd_for_each_listener(listener_forked);
	/* nobody will offer there for us: its descriptors are not ours to hold
	 * (a fork-per-connection server's children, by the thousand) */
	if (!forked_named_inbox)
		inbox_inherited_drop_forking();
}

void hs_listener_closed(int fd)
{
	int lock = fd_take_listen_lock(fd), copy;

	/* the listener lives on under another number (dup2 to 0, as php-fpm's
	 * workers do): the entry goes with it.  Closed, the entry would leave
	 * the address to entries of processes that do not accept here (their
	 * master's), and clients would offer where nobody takes */
	if (lock >= 0 && (copy = fd_listener_copy(fd)) >= 0)
		fd_set_listen_lock(copy, lock);
	else if (lock >= 0)
		sys_close(lock);        /* a fork child holds an entry of its own (listener_forked) */
	direct_listener_closed(fd);
}
