/*
 * hs_internal.h - what the handshake's files share among themselves (not
 * for the layers above, which include handshake.h; this directory is not on
 * their include path).
 */
#ifndef SMCLO_HS_INTERNAL_H
#define SMCLO_HS_INTERNAL_H

#include "handshake.h"
#include "fdtab.h"
#include "sockopt.h"

#include "addr.h"
#include "clc.h"
#include "config.h"
#include "conn.h"
#include "inbox.h"
#include "log.h"
#include "sys.h"

#include <stdint.h>
#include <sys/types.h>

/* ---- listener.c --------------------------------------------------------- */

/* A process that confines itself (moved.c): clients of its listeners take
 * TCP at once, as after a privilege drop to a user without the registry. */
void listeners_confined(void);

/* ---- proof.c ------------------------------------------------------------ */

uint64_t proof_netns_cookie(int fd);
int proof_sock_is_tcp(int fd);
/* Is @dst an address of this host (of our network namespace)? */
int proof_dst_is_local(const struct ep *dst);
/* An io_uring instance not made through liburing (hs_uring_seen): its
 * submissions bypass libc unseen, so its process declines connections. */
int proof_io_uring_unseen(void);
/* Any io_uring instance: no connection without TCP beneath (direct), which
 * could not move if io_uring came to use it. */
int proof_io_uring_any(void);
/* What socket @fd was created as: AF_INET, AF_INET6 or AF_SMC. */
int proof_domain_of(int fd);
/* The process that made socket pair @s, if its user may attach (its user in
 * *@uid, if given); else -1. */
pid_t proof_peer_pid_allowed(int s, uid_t *uid);
/* Is @theirs the other end of our TCP connection @local -> @peer in @netns,
 * of user @peer_uid?  (Another namespace only for trusted users.) */
int proof_ok(const struct ep *local, const struct ep *peer, uint64_t netns, int theirs,
             uid_t peer_uid);
/* The rest of the proof once the addresses of @theirs are known to mirror ours. */
int proof_same_host(const struct ep *local, uint64_t netns, int theirs, uid_t peer_uid);

/* ---- messages.c --------------------------------------------------------- */

/* Wait until @fd has @events, or @deadline (mono_now_ms) passes: 0 or -1. */
int hs_msg_wait_fd(int fd, short events, long deadline);
int hs_msg_send(int s, const union clc_msg *m, const int *fds, int nfds);
/* clc_recv(), waiting until @deadline for the message to arrive. */
int hs_msg_recv(int s, enum clc_type type, uint64_t nonce, union clc_msg *m, int *fds, int want,
                long deadline);
void hs_msg_decline_init(union clc_msg *m, uint64_t nonce, int reason);

/* ---- install.c ---------------------------------------------------------- */

/* The shared memory of a connection being set up. */
struct shm_parts {
	struct region *region;
	struct conn_shared *sh;
	uint32_t up, down;      /* ring data sizes, client->server and back */
	int rcvtimeo_ms;        /* SO_RCVTIMEO carried over (sockopt_copy_timeouts) */
	int direct;             /* set up without a TCP connection (conn.direct) */
};

/* A connection left on TCP, bound to @fd: listed with its reason. */
struct conn *install_tcp(int fd, int role, int reason, const struct ep *l, const struct ep *p);
void install_parts_free(struct shm_parts *p);
/* A shared-memory connection made of @p (which it takes), not yet bound. */
struct conn *install_new_shm(int slot_fd, int role, struct shm_parts *p, const struct ep *l,
                          const struct ep *r, int domain, int nonblock);
/*
 * The file's signal settings a program made on socket @from - who gets
 * SIGIO and SIGURG (F_SETOWN_EX), which signal (F_SETSIG), O_ASYNC - made
 * on @to, which is about to take @from's number (a handshake's switch, a
 * move to TCP).  @hide: @from goes on hidden beneath the connection, where
 * its own O_ASYNC would raise signals for a socket the program no longer
 * sees: cleared there.  Returns 1 if O_ASYNC was set.
 */
int install_carry_signals(int from, int to, int hide);
/* Under a small descriptor budget: drop what a connection can do without. */
void install_go_lean(struct conn *c);
/* A shared-memory connection made of @p, bound to @app_fd. */
void install_shm(int app_fd, int tcp_fd, int role, struct shm_parts *p, const struct ep *l,
              const struct ep *r, int domain, int nonblock);

/* ---- server.c ----------------------------------------------------------- */

struct server {
	int fd;                 /* accepted TCP socket (-1: direct) */
	int lfd;                /* direct: the listener */
	int direct;             /* a direct offer: no TCP connection */
	struct ep listen_addr;  /* direct: what the listener is bound to */
	int flags;              /* accept4() flags */
	struct ep local, peer;
	uint64_t netns;
	char key[96];
	int rendezvous;         /* O_PATH descriptor of the client's p/<key> */
	uint64_t nonce;
	int s;                  /* our end of the socket pair, or -1 */
	uint64_t tcp_prefix;    /* the client's first bytes, moved from TCP to its ring */
	int confirm_ms;         /* how long to wait for CONFIRM; 0: the handshake timeout */
};

/* The process's one socket that sends every ACCEPT and DECLINE, or -1. */
int server_answer_sock(void);
/* Reasons not to try at all; R_NONE means go ahead. */
int server_precheck(void);
int server_take_offer(struct server *sv, const union clc_msg *m, int fds[OFFER_FDS]);

/* ---- direct.c ----------------------------------------------------------- */

/* After listener @lfd took an smclo client's offer: the next may come without TCP. */
void direct_listener_go(int lfd);
/* Listener @fd is closed: offers queued at its direct inbox go back to TCP. */
void direct_listener_closed(int fd);

/* ---- listener.c --------------------------------------------------------- */

/* An entry for listener @fd naming @offer; returns its (hidden) lock, or -1. */
int listener_register(int fd, const struct listener_offer *offer);
/* 1 if clients of other users would believe an entry we made now for @fd. */
int listener_entry_believed(int fd);

#endif
