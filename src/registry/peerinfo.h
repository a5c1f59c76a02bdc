/*
 * peerinfo.h - who holds the other end of a socket on this host.
 *
 * The kernel's sock_diag names the socket at the other end (its inode), and
 * /proc/<pid>/fd names the processes holding a socket of that inode.  The
 * library asks before it passes a connection over a unix socket (passfd.c:
 * does the receiver run smclo?); `smclo stat` asks for connections left on
 * TCP (which program is at the other end?).
 */
#ifndef SMCLO_PEERINFO_H
#define SMCLO_PEERINFO_H

#include "addr.h"

#include <stddef.h>
#include <sys/types.h>

/* The inode of the socket at the other end of unix socket @sock; 0 if unknown. */
unsigned long peerinfo_unix_peer_ino(int sock);
/* The same for the unix socket of inode @ino. */
unsigned long peerinfo_unix_peer_of(unsigned long ino);
/* The user process @pid runs as (the owner of /proc/<pid>); -1 if gone. */
int peerinfo_uid(int pid, uid_t *uid);

/* A TCP socket of this network namespace: its inode and both ends. */
struct peerinfo_tcp {
	unsigned long ino;
	struct ep local, remote;
};
/*
 * Every TCP socket of this network namespace that a descriptor holds (not
 * listeners, nor orphans still closing), IPv4 and IPv6, in *@out (malloc'd,
 * the caller frees it).  Returns how many, or -1.  One dump serves any
 * number of look-ups: `smclo stat` may list thousands of connections.
 */
int peerinfo_tcp_list(struct peerinfo_tcp **out);
/* The socket of inode @ino in @list; NULL if not there. */
const struct peerinfo_tcp *peerinfo_tcp_by_ino(const struct peerinfo_tcp *list, int n,
                                               unsigned long ino);
/* The socket of @list with these ends (the other end of a connection: swap them). */
const struct peerinfo_tcp *peerinfo_tcp_by_ends(const struct peerinfo_tcp *list, int n,
                                                const struct ep *local, const struct ep *remote);

/*
 * The user the kernel says owns a TCP socket of this network namespace:
 * the established connection with exactly these ends, or, with @remote's
 * port 0, the listener a segment to @local would reach.  One exact
 * sock_diag look-up, no dump.  0 and *@uid set, or -1 if there is no such
 * socket or the kernel could not be asked.
 */
int peerinfo_tcp_uid(const struct ep *local, const struct ep *remote, uid_t *uid);

/* The inode of the socket descriptor @fd of process @pid holds; 0 if none or not readable. */
unsigned long peerinfo_fd_ino(int pid, int fd);

/*
 * Call @fn(pid, inode, @arg) for every socket descriptor of every process
 * whose /proc/<pid>/fd we may read, until @fn returns non-zero; returns
 * that value (0 when every descriptor was visited).
 */
typedef int (*peerinfo_socket_fn)(int pid, unsigned long ino, void *arg);
int peerinfo_each_socket(peerinfo_socket_fn fn, void *arg);

/*
 * What runs as @pid: the path of its executable, or "[name]" (its comm)
 * when that link may not be read.  -1 if the process is gone.
 */
int peerinfo_exe(int pid, char *out, size_t len);

#endif
