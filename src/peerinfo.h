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

/* The inode of the socket at the other end of unix socket @sock; 0 if unknown. */
unsigned long peerinfo_unix_peer_ino(int sock);

/*
 * The inode of the TCP socket of this network namespace whose own end is
 * @local and whose other end is @remote; 0 if there is none (or it belongs
 * to no descriptor any more: an orphan still closing).
 */
unsigned long peerinfo_tcp_ino(const struct ep *local, const struct ep *remote);

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
