/*
 * clc.h - handshake messages (the kernel's CLC: proposal, accept, confirm,
 * decline), as bytes on the wire.
 *
 * The proposal is a file the client writes into the registry under the
 * connection's address tuple before its SYN can reach the server.  The other
 * messages travel over the AF_UNIX SOCK_SEQPACKET connection that the server
 * opens to the client's side socket; ACCEPT and CONFIRM carry two
 * descriptors (the sender's sealed ring and its TCP socket, the latter as
 * proof that the sender owns that end of the TCP connection).
 *
 * Every message starts with the same header; clc_parse() rejects anything
 * truncated, oversized, of the wrong type or version, or with values outside
 * their ranges, before a field is used.
 */
#ifndef SMCLO_CLC_H
#define SMCLO_CLC_H

#include <stddef.h>
#include <stdint.h>

#define CLC_MAGIC    0x434c4353u   /* "SCLC" */
#define CLC_VERSION  1
#define CLC_SIDE_MAX 64            /* side socket name, NUL included */

enum clc_type {
	CLC_PROPOSAL = 1,
	CLC_ACCEPT   = 2,
	CLC_CONFIRM  = 3,
	CLC_DECLINE  = 4,
	CLC_FINAL    = 5,
};

struct clc_hdr {
	uint32_t magic;
	uint8_t type;
	uint8_t version;
	uint16_t length;      /* whole message, header included */
	uint64_t nonce;       /* picks out one proposal: stale messages are dropped */
};

struct clc_proposal {
	struct clc_hdr hdr;
	uint32_t pid;
	uint32_t uid;
	uint32_t rx_max;      /* largest ring the client will map from the server */
	uint32_t tx_size;     /* ring size the client wants to send with */
	uint64_t netns;       /* client's network namespace cookie */
	char side[CLC_SIDE_MAX];
};

/* ACCEPT (server -> client) and CONFIRM (client -> server). */
struct clc_accept {
	struct clc_hdr hdr;
	uint32_t pid;
	uint32_t ring_size;   /* size of the ring whose descriptor comes along */
	uint32_t rx_max;      /* largest ring the sender will map from the peer */
	uint32_t pad;
	uint64_t netns;
};

struct clc_decline {
	struct clc_hdr hdr;
	uint32_t reason;
	uint32_t pad;
};

struct clc_final {
	struct clc_hdr hdr;
	uint32_t ok;
	uint32_t pad;
};

union clc_msg {
	struct clc_hdr hdr;
	struct clc_proposal proposal;
	struct clc_accept accept;
	struct clc_decline decline;
	struct clc_final final;
};

/* Fill the header of @m for @type; the length comes from the type. */
void clc_init(union clc_msg *m, enum clc_type type, uint64_t nonce);
size_t clc_size(enum clc_type type);

/*
 * Validate @len bytes at @buf as a message of @type with @nonce (any nonce if
 * @nonce is 0) and copy it to @out.  Returns 0 or -1.  A DECLINE is accepted
 * wherever ACCEPT or FINAL is expected, so callers check out->hdr.type.
 */
int clc_parse(const void *buf, size_t len, enum clc_type type, uint64_t nonce,
              union clc_msg *out);

#endif
