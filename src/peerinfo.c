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

/*
 * Send one sock_diag request (@req, @len bytes, a netlink header first) and
 * return the payload of the answer in @buf, or NULL: an exact lookup gets
 * one message, or an error when there is no such socket.
 */
static void *diag_ask(const void *req, size_t len, long *buf, size_t buflen, size_t *plen)
{
	struct nlmsghdr *h = (struct nlmsghdr *)buf;
	int nl = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	ssize_t n = -1;

	if (nl < 0)
		return NULL;
	if (sys_send(nl, req, len, 0) == (ssize_t)len)
		n = sys_recv(nl, buf, buflen, 0);
	sys_close(nl);
	if (n <= 0 || !NLMSG_OK(h, (size_t)n) || h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
		return NULL;
	*plen = h->nlmsg_len - NLMSG_LENGTH(0);
	return NLMSG_DATA(h);
}

unsigned long peerinfo_unix_peer_ino(int sock)
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
	struct stat st;
	long buf[1024];
	size_t len;
	struct unix_diag_msg *m;

	if (fstat(sock, &st) < 0)
		return 0;
	q.req.udiag_ino = (unsigned)st.st_ino;
	if (!(m = diag_ask(&q, sizeof(q), buf, sizeof(buf), &len)) || len < sizeof(*m))
		return 0;
	struct rtattr *a = (struct rtattr *)(m + 1);
	int alen = (int)(len - NLMSG_ALIGN(sizeof(*m)));
	for (; RTA_OK(a, alen); a = RTA_NEXT(a, alen))
		if (a->rta_type == UNIX_DIAG_PEER)
			return *(uint32_t *)RTA_DATA(a);
	return 0;
}

/* @e into a sock_diag address: the IPv4 one for a v4-mapped endpoint. */
static int diag_addr(const struct ep *e, uint32_t out[4])
{
	memset(out, 0, 16);
	if (ep_is_v4(e)) {
		memcpy(out, e->ip + 12, 4);
		return AF_INET;
	}
	memcpy(out, e->ip, 16);
	return AF_INET6;
}

unsigned long peerinfo_tcp_ino(const struct ep *local, const struct ep *remote)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 req;
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		        .nlmsg_flags = NLM_F_REQUEST },
		.req = { .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u,
		         .id = { .idiag_sport = htons(local->port), .idiag_dport = htons(remote->port),
		                 .idiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } } },
	};
	long buf[1024];
	size_t len;
	struct inet_diag_msg *m;

	q.req.sdiag_family = (uint8_t)diag_addr(local, q.req.id.idiag_src);
	if (diag_addr(remote, q.req.id.idiag_dst) != q.req.sdiag_family)
		return 0;
	if (!(m = diag_ask(&q, sizeof(q), buf, sizeof(buf), &len)) || len < sizeof(*m))
		return 0;
	/* with no such connection the kernel's lookup may answer with the
	 * listener on that port: not the other end */
	if (m->id.idiag_dport != q.req.id.idiag_dport)
		return 0;
	return m->idiag_inode;
}

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
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
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
