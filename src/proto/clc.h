/*
 * clc.h - handshake messages (the kernel's CLC: accept, confirm, decline), as
 * bytes on the wire.
 *
 * ACCEPT goes from the server to the client's rendezvous socket and carries
 * three descriptors: one end of the socket pair that becomes the connection
 * (the doorbell), the server's sealed ring, and the server's TCP socket as
 * proof that the sender owns that end of the TCP connection.  CONFIRM (the
 * client's ring and TCP socket) or DECLINE answers over the socket pair.
 *
 * OFFER carries all of a client's part at once (inbox.h).
 *
 * Every message starts with the same header; clc_parse() rejects anything
 * truncated, oversized, of the wrong type or version, or with values outside
 * their ranges, before a field is used.
 */
#ifndef SMCLO_CLC_H
#define SMCLO_CLC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define CLC_MAGIC    0x434c4353u   /* "SCLC" */
#define CLC_VERSION  2

enum clc_type {
	CLC_ACCEPT   = 2,
	CLC_CONFIRM  = 3,
	CLC_DECLINE  = 4,
	CLC_OFFER    = 5,     /* client -> server's inbox (inbox.h) */
	CLC_DIRECT   = 6,     /* client -> a listener's direct inbox: no TCP follows */
};

struct clc_hdr {
	uint32_t magic;
	uint8_t type;
	uint8_t version;
	uint16_t length;      /* whole message, header included */
	uint64_t nonce;       /* set by the server, echoed by the client */
};

/*
 * ACCEPT (server -> client), CONFIRM (client -> server), and OFFER (client
 * -> inbox: ring_size is the client->server ring, rx_max the one back).
 */
struct clc_accept {
	struct clc_hdr hdr;
	uint32_t pid;
	uint32_t ring_size;   /* data size of the ring whose descriptor comes along */
	uint32_t rx_max;      /* ACCEPT: largest ring the server maps from the client;
	                         CONFIRM: how much of the server's ring the client maps */
	uint32_t flags;       /* OFFER: CLC_OFFER_F_*; 0 otherwise */
	uint64_t netns;
};

/* The client's first bytes go over TCP, to wake a listener that defers
 * accept; the server moves them into the ring (ring_hdr.tcp_prefix). */
#define CLC_OFFER_F_TCP_PREFIX 1u

/* An offer for a connection that has no TCP connection behind it. */
struct clc_direct {
	struct clc_accept offer;
	uint8_t dst_ip[16];   /* the address the client connect()ed to (struct ep) */
	uint16_t dst_port;
	uint8_t pad[6];
};

struct clc_decline {
	struct clc_hdr hdr;
	uint32_t reason;
	uint32_t pad;
};

union clc_msg {
	struct clc_hdr hdr;
	struct clc_accept accept;     /* also the head of a CLC_DIRECT */
	struct clc_direct direct;
	struct clc_decline decline;
};

/* Fill the header of @m for @type; the length comes from the type. */
void clc_init(union clc_msg *m, enum clc_type type, uint64_t nonce);
size_t clc_size(enum clc_type type);

/*
 * Validate @len bytes at @buf as a message of @type with @nonce (any nonce if
 * @nonce is 0) and copy it to @out.  Returns 0 or -1.  A DECLINE is accepted
 * wherever ACCEPT or CONFIRM is expected, so callers check out->hdr.type.
 */
int clc_parse(const void *buf, size_t len, enum clc_type type, uint64_t nonce,
              union clc_msg *out);

/* ---- messages on sockets, with the descriptors they carry ---- */

#define CLC_MAX_FDS 3

/* A message and its descriptors, laid out for sendmsg(). */
struct clc_out {
	struct iovec iov;
	struct msghdr mh;
	char cbuf[CMSG_SPACE(CLC_MAX_FDS * sizeof(int))];
};

struct msghdr *clc_prepare(struct clc_out *o, const union clc_msg *m, const int *fds, int nfds);

/*
 * Receive one message of @type (or DECLINE, see clc_parse) for @nonce from
 * @s without waiting, with exactly @want descriptors (none for DECLINE).
 * Returns 0, or -1 with errno EAGAIN if nothing is there, EPROTO if it is
 * malformed (descriptors of a rejected message are closed).
 */
int clc_recv(int s, enum clc_type type, uint64_t nonce, union clc_msg *m, int *fds, int want);

#endif
