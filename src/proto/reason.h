/*
 * reason.h - why a connection is not accelerated.
 *
 * Modelled on the kernel's SMC_CLC_DECL_* codes: every connection that stays
 * on TCP carries one of these, shown by `smclo stat` and counted by
 * `smclo stats`.  The numbers are part of the registry file format.
 */
#ifndef SMCLO_REASON_H
#define SMCLO_REASON_H

enum smclo_reason {
	R_NONE = 0,            /* accelerated, or not decided yet */
	R_PEER_NO_SMCLO,       /* no smclo listener / rendezvous on the other end */
	R_NOT_THIS_HOST,       /* a listener exists for the port, not for this address or namespace */
	R_MAX_BUFFERS,         /* SMCLO_MAX_CONNS reached */
	R_NO_MEMORY,           /* shared memory could not be created or mapped */
	R_TIMEOUT,             /* the peer did not answer within the handshake timeout */
	R_IO_URING,            /* an io_uring smclo cannot watch in this process or the
	                          peer; moved: the socket itself used through io_uring */
	R_DIFF_USER,           /* peers run as different users and it is not allowed */
	R_TUPLE_BUSY,          /* another rendezvous holds this address/port tuple */
	R_PROOF_FAILED,        /* the peer could not prove it owns the other TCP end */
	R_DEFER_ACCEPT,        /* the listener uses TCP_DEFER_ACCEPT */
	R_HANDSHAKE_ERROR,     /* a malformed or unexpected handshake message */
	R_PEER_WITHDREW,       /* the client gave up before this side answered */
	R_NO_PORT,             /* no ephemeral port could be reserved for the rendezvous */
	R_NO_REGISTRY,         /* the registry directory is unusable */
	R_CROSS_NETNS_OFF,     /* peer in another namespace and SMCLO_CROSS_NETNS=0 */
	R_SHORT_LIVED,         /* short connections to this peer, CPUs oversubscribed (payoff.h) */
	R_DIRECT_ENDED,        /* the listener stopped taking connections without TCP */
	R_EXEC_NO_SMCLO,       /* handed to a program that cannot load smclo: reset */
	R_HANDOVER_LOST,       /* handed over, but its state did not reach the new program: reset */
	R_EPOLL_EARLY,         /* in an epoll set before connect(): the registration would not
	                          follow the switch (it names the TCP socket) */
	R_UNVERIFIED,          /* a listener entry or rendezvous of a user the kernel does not
	                          say owns the listening socket or the client's end */
	R_PRIVATE_REGISTRY,    /* no listener in this user's own registry, used because the
	                          host's shared one is missing or not root's */
	R_SANDBOX,             /* the process confines itself (a seccomp filter, a descriptor
	                          limit below its connections): they go on over TCP, new ones
	                          are not accelerated (core/move.c, shim/seccomp.c) */
	R_PEER_MOVED,          /* the peer moved the connection to TCP (core/move.c) */
	R_URGENT,              /* urgent data (MSG_OOB) sent: the connection went on over TCP */
	R_KERNEL_TLS,          /* an upper layer protocol (TCP_ULP: kernel TLS) set: the connection
	                          went on over TCP, where the kernel encrypts (shim/socket.c) */
	R_OFFER_MISSED,        /* the server answered over TCP while our offer was open: it
	                          accepted without finding it (a shared inbox's other reader
	                          held it out too long: handshake/inbox.c) */
	R_HANDED_ON,           /* handed to a program that cannot load smclo (exec, SCM_RIGHTS)
	                          with nothing left unread in the ring: went on over TCP */
	R_COUNT
};

/* Short stable identifier ("peer-no-smclo") and a sentence for humans. */
const char *reason_id(int r);
const char *reason_text(int r);

#endif
