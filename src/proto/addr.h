/*
 * addr.h - socket addresses as smclo compares and names them.
 *
 * IPv4 and IPv6 endpoints are normalised to one 16-byte form (IPv4 as
 * v4-mapped IPv6) so a v6 listener accepting a v4 client and the v4 client
 * agree on the registry key.
 */
#ifndef SMCLO_ADDR_H
#define SMCLO_ADDR_H

#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>

struct ep {
	uint8_t ip[16];     /* v4-mapped for IPv4 */
	uint16_t port;      /* host order */
};

int ep_from_sockaddr(struct ep *e, const struct sockaddr *sa, socklen_t len);
/*
 * @e as a socket address of a socket of @domain (an IPv4 endpoint in an
 * AF_INET6 socket is v4-mapped); its length.
 */
socklen_t ep_to_sockaddr(const struct ep *e, int domain, struct sockaddr_storage *ss);
/* ep_to_sockaddr, copied out as the kernel would: truncated to *@len, the full length told. */
void ep_copy_out(const struct ep *e, int domain, struct sockaddr *sa, socklen_t *len);
/* The local (@peer 0) or remote address of socket @fd; -1 if not IP. */
int ep_of_socket(int fd, int peer, struct ep *e);
int ep_is_v4(const struct ep *e);
int ep_is_loopback(const struct ep *e);
int ep_is_any(const struct ep *e);
int ep_ip_equal(const struct ep *a, const struct ep *b);
/* Does a listener bound to @l's address (IPV6_V6ONLY: @v6only) take connections to @dst's? */
int ep_covers(const struct ep *l, const struct ep *dst, int v6only);
int ep_equal(const struct ep *a, const struct ep *b);

/* 32 hex digits of the address, for registry names. */
void ep_ip_hex(const struct ep *e, char out[33]);
int ep_ip_from_hex(struct ep *e, const char *hex);

/* "127.0.0.1:6379" or "[::1]:6379". */
void ep_format(const struct ep *e, char *out, size_t len);

#endif
