/*
 * peerinfo.c - who holds the other end of a socket (peerinfo.h).
 *
 * Shared by the library and the `smclo` command, so it calls the kernel
 * through sys.h for its own descriptors (the library interposes close and
 * socket) and keeps no state.
 */
#include "peerinfo.h"

#include "sys.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* The socket inode /proc/<pid>/fd/<fd> links to, 0 if it is no socket. */
static unsigned long fd_socket_ino(const char *pid, const char *fd)
{
	char path[300], link[64];
	unsigned long ino = 0;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%s/fd/%s", pid, fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return 0;
	link[n] = '\0';
	if (sscanf(link, "socket:[%lu]", &ino) != 1)
		return 0;
	return ino;
}

typedef void (*diag_fn)(const void *msg, size_t len, void *arg);

/* Hand @fn every answer of one datagram; 1 once the answer is complete. */
static int diag_messages(const long *buf, ssize_t n, diag_fn fn, void *arg)
{
	const struct nlmsghdr *h = (const struct nlmsghdr *)buf;
	size_t left = (size_t)n;

	for (; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
		if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR)
			return 1;
		if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY)
			fn(NLMSG_DATA(h), h->nlmsg_len - NLMSG_LENGTH(0), arg);
		if (!(h->nlmsg_flags & NLM_F_MULTI))
			return 1;       /* an exact look-up: one answer */
	}
	return 0;
}

/*
 * Send one sock_diag request (@req, @len bytes, a netlink header first) and
 * hand @fn each socket of the answer: one for an exact look-up (none when
 * there is no such socket), any number for a dump.  @buf of @buflen bytes
 * holds one datagram of the answer.  -1 if the kernel could not be asked.
 */
static int diag_query(const void *req, size_t len, long *buf, size_t buflen, diag_fn fn,
                      void *arg)
{
	int nl = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	int rc = -1;
	ssize_t n;

	if (nl < 0)
		return -1;
	if (sys_send(nl, req, len, 0) == (ssize_t)len)
		while ((n = sys_recv(nl, buf, buflen, 0)) > 0)
			if (rc = 0, diag_messages(buf, n, fn, arg))
				break;
	sys_close(nl);
	return rc;
}

static void unix_peer_of(const void *msg, size_t len, void *arg)
{
	const struct unix_diag_msg *m = msg;
	const struct rtattr *a = (const struct rtattr *)(m + 1);
	int alen = (int)len - (int)NLMSG_ALIGN(sizeof(*m));

	for (; alen > 0 && RTA_OK(a, alen); a = RTA_NEXT(a, alen))
		if (a->rta_type == UNIX_DIAG_PEER)
			*(unsigned long *)arg = *(const uint32_t *)RTA_DATA(a);
}

unsigned long peerinfo_unix_peer_of(unsigned long ino)
{
	struct {
		struct nlmsghdr nh;
		struct unix_diag_req req;
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		        .nlmsg_flags = NLM_F_REQUEST },
		.req = { .sdiag_family = AF_UNIX, .udiag_states = ~0u, .udiag_show = UDIAG_SHOW_PEER,
		         .udiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } },
	};
	long buf[1024];
	unsigned long peer = 0;

	q.req.udiag_ino = (unsigned)ino;
	if (ino)
		diag_query(&q, sizeof(q), buf, sizeof(buf), unix_peer_of, &peer);
	return peer;
}

unsigned long peerinfo_unix_peer_ino(int sock)
{
	struct stat st;

	return fstat(sock, &st) < 0 ? 0 : peerinfo_unix_peer_of(st.st_ino);
}

int peerinfo_uid(int pid, uid_t *uid)
{
	char path[32];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%d", pid);
	if (pid <= 0 || stat(path, &st) < 0)
		return -1;
	*uid = st.st_uid;
	return 0;
}

/* A sock_diag address as an endpoint (IPv4 ones v4-mapped). */
static void ep_of_diag(struct ep *e, int family, const __be32 addr[4], __be16 port)
{
	memset(e, 0, sizeof(*e));
	if (family == AF_INET) {
		e->ip[10] = e->ip[11] = 0xff;
		memcpy(e->ip + 12, addr, 4);
	} else {
		memcpy(e->ip, addr, 16);
	}
	e->port = ntohs(port);
}

struct tcp_list {
	struct peerinfo_tcp *v;
	int n, cap, failed;
};

static void tcp_add(const void *msg, size_t len, void *arg)
{
	const struct inet_diag_msg *m = msg;
	struct tcp_list *l = arg;
	struct peerinfo_tcp *t;

	if (len < sizeof(*m) || !m->idiag_inode || l->failed)
		return;         /* no inode: an orphan, nobody holds it */
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 256;
		t = realloc(l->v, (size_t)cap * sizeof(*t));
		if (!t) {
			l->failed = 1;
			return;
		}
		l->v = t;
		l->cap = cap;
	}
	t = &l->v[l->n++];
	t->ino = m->idiag_inode;
	ep_of_diag(&t->local, m->idiag_family, m->id.idiag_src, m->id.idiag_sport);
	ep_of_diag(&t->remote, m->idiag_family, m->id.idiag_dst, m->id.idiag_dport);
}

int peerinfo_tcp_list(struct peerinfo_tcp **out)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 req;
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		        .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.req = { .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~(1u << 10) /* TCP_LISTEN */ },
	};
	const size_t buflen = 64 << 10;     /* the kernel sizes dump datagrams by what we read */
	struct tcp_list l = { 0 };
	long *buf = malloc(buflen);
	int rc = 0;

	if (!buf)
		return -1;
	q.req.sdiag_family = AF_INET;
	rc |= diag_query(&q, sizeof(q), buf, buflen, tcp_add, &l);
	q.req.sdiag_family = AF_INET6;
	rc |= diag_query(&q, sizeof(q), buf, buflen, tcp_add, &l);
	free(buf);
	if (rc < 0 || l.failed) {
		free(l.v);
		return -1;
	}
	*out = l.v;
	return l.n;
}

const struct peerinfo_tcp *peerinfo_tcp_by_ino(const struct peerinfo_tcp *list, int n,
                                               unsigned long ino)
{
	for (int i = 0; i < n; i++)
		if (list[i].ino == ino)
			return &list[i];
	return NULL;
}

const struct peerinfo_tcp *peerinfo_tcp_by_ends(const struct peerinfo_tcp *list, int n,
                                                const struct ep *local, const struct ep *remote)
{
	for (int i = 0; i < n; i++)
		if (ep_equal(&list[i].local, local) && ep_equal(&list[i].remote, remote))
			return &list[i];
	return NULL;
}

/* A sock_diag address from an endpoint; the family both ends share. */
static void diag_of_ep(const struct ep *e, int family, __be32 addr[4], __be16 *port)
{
	if (family == AF_INET)
		memcpy(addr, e->ip + 12, 4);
	else
		memcpy(addr, e->ip, 16);
	*port = htons(e->port);
}

struct tcp_owner {
	uid_t uid;
	int found;
	struct ep local, remote;
	int state;
};

static void tcp_uid_of(const void *msg, size_t len, void *arg)
{
	const struct inet_diag_msg *m = msg;
	struct tcp_owner *out = arg;

	if (len >= sizeof(*m)) {
		out->uid = (uid_t)m->idiag_uid;
		out->state = m->idiag_state;
		ep_of_diag(&out->local, m->idiag_family, m->id.idiag_src, m->id.idiag_sport);
		ep_of_diag(&out->remote, m->idiag_family, m->id.idiag_dst, m->id.idiag_dport);
		out->found = 1;
	}
}

/*
 * Is the socket the kernel answered with the one asked for?  The look-up
 * falls back from a connection to a listener (one on 0.0.0.0:port answers
 * for any address, a remote one included): a connection must be
 * established with exactly these ends, a listener must listen.
 */
static int tcp_owner_is(const struct tcp_owner *o, const struct ep *local,
                        const struct ep *remote)
{
	if (!o->found)
		return 0;
	if (remote->port == 0)
		return o->state == 10 /* TCP_LISTEN */ && o->local.port == local->port;
	return o->state == 1 /* TCP_ESTABLISHED */ && ep_equal(&o->local, local) &&
	       ep_equal(&o->remote, remote);
}

int peerinfo_tcp_uid(const struct ep *local, const struct ep *remote, uid_t *uid)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 req;
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		        .nlmsg_flags = NLM_F_REQUEST },
		.req = { .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u,
		         .id = { .idiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } } },
	};
	struct tcp_owner out = { 0 };
	long buf[512];

	/* an IPv4 look-up also finds an IPv6 socket that takes IPv4 (not V6ONLY) */
	q.req.sdiag_family = ep_is_v4(local) ? AF_INET : AF_INET6;
	diag_of_ep(local, q.req.sdiag_family, q.req.id.idiag_src, &q.req.id.idiag_sport);
	diag_of_ep(remote, q.req.sdiag_family, q.req.id.idiag_dst, &q.req.id.idiag_dport);
	if (diag_query(&q, sizeof(q), buf, sizeof(buf), tcp_uid_of, &out) < 0 ||
	    !tcp_owner_is(&out, local, remote))
		return -1;
	*uid = out.uid;
	return 0;
}

unsigned long peerinfo_fd_ino(int pid, int fd)
{
	char p[16], f[16];

	snprintf(p, sizeof(p), "%d", pid);
	snprintf(f, sizeof(f), "%d", fd);
	return pid > 0 && fd >= 0 ? fd_socket_ino(p, f) : 0;
}

static int each_socket_of(const char *pid, peerinfo_socket_fn fn, void *arg)
{
	char path[300];
	struct dirent *f;
	DIR *fds;
	int rc = 0;

	snprintf(path, sizeof(path), "/proc/%s/fd", pid);
	if (!(fds = opendir(path)))
		return 0;
	while (!rc && (f = readdir(fds))) {
		unsigned long ino = f->d_name[0] == '.' ? 0 : fd_socket_ino(pid, f->d_name);
		if (ino)
			rc = fn(atoi(pid), ino, arg);
	}
	closedir(fds);
	return rc;
}

int peerinfo_each_socket(peerinfo_socket_fn fn, void *arg)
{
	struct dirent *p;
	DIR *procs = opendir("/proc");
	int rc = 0;

	if (!procs)
		return 0;
	while (!rc && (p = readdir(procs)))
		if (p->d_name[0] >= '1' && p->d_name[0] <= '9')
			rc = each_socket_of(p->d_name, fn, arg);
	closedir(procs);
	return rc;
}

int peerinfo_exe(int pid, char *out, size_t len)
{
	char path[64], comm[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/exe", pid);
	n = readlink(path, out, len - 1);
	if (n > 0) {
		out[n] = '\0';
		return 0;
	}
	/* another user's process: its name is still public */
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	if ((fd = sys_open_read(path)) < 0)
		return -1;
	n = sys_read(fd, comm, sizeof(comm) - 1);
	sys_close(fd);
	if (n <= 0)
		return -1;
	comm[n] = '\0';
	comm[strcspn(comm, "\n")] = '\0';
	snprintf(out, len, "[%s]", comm);
	return 0;
}
