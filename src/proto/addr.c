/*
 * addr.c - normalised endpoints (see addr.h).
 */
#include "addr.h"

#include "sys.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

static const uint8_t v4mapped_prefix[12] = { 0,0,0,0, 0,0,0,0, 0,0,0xff,0xff };

int ep_from_sockaddr(struct ep *e, const struct sockaddr *sa, socklen_t len)
{
	memset(e, 0, sizeof(*e));
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s = (const void *)sa;
		memcpy(e->ip, v4mapped_prefix, 12);
		memcpy(e->ip + 12, &s->sin_addr, 4);
		e->port = ntohs(s->sin_port);
		return 0;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *s = (const void *)sa;
		memcpy(e->ip, &s->sin6_addr, 16);
		e->port = ntohs(s->sin6_port);
		return 0;
	}
	return -1;
}

socklen_t ep_to_sockaddr(const struct ep *e, int domain, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (domain != AF_INET6 && ep_is_v4(e)) {
		struct sockaddr_in *s = (void *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(e->port);
		memcpy(&s->sin_addr, e->ip + 12, 4);
		return sizeof(*s);
	}
	struct sockaddr_in6 *s = (void *)ss;
	s->sin6_family = AF_INET6;
	s->sin6_port = htons(e->port);
	memcpy(&s->sin6_addr, e->ip, 16);
	return sizeof(*s);
}

void ep_copy_out(const struct ep *e, int domain, struct sockaddr *sa, socklen_t *len)
{
	struct sockaddr_storage ss;
	socklen_t n = ep_to_sockaddr(e, domain, &ss);

	memcpy(sa, &ss, *len < n ? *len : n);
	*len = n;
}

int ep_is_v4(const struct ep *e)
{
	return memcmp(e->ip, v4mapped_prefix, 12) == 0;
}

int ep_is_loopback(const struct ep *e)
{
	static const uint8_t v6lo[16] = { [15] = 1 };

	if (ep_is_v4(e))
		return e->ip[12] == 127;
	return memcmp(e->ip, v6lo, 16) == 0;
}

int ep_is_any(const struct ep *e)
{
	static const uint8_t zero[16];

	if (ep_is_v4(e))
		return memcmp(e->ip + 12, zero, 4) == 0;
	return memcmp(e->ip, zero, 16) == 0;
}

int ep_ip_equal(const struct ep *a, const struct ep *b)
{
	return memcmp(a->ip, b->ip, 16) == 0;
}

int ep_covers(const struct ep *l, const struct ep *dst, int v6only)
{
	if (ep_ip_equal(l, dst))
		return 1;
	if (!ep_is_any(l))
		return 0;
	/* a v6 wildcard listener takes v4 clients unless IPV6_V6ONLY */
	if (ep_is_v4(l))
		return ep_is_v4(dst);
	return !ep_is_v4(dst) || !v6only;
}

int ep_equal(const struct ep *a, const struct ep *b)
{
	return ep_ip_equal(a, b) && a->port == b->port;
}

void ep_ip_hex(const struct ep *e, char out[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", e->ip[i]);
}

int ep_ip_from_hex(struct ep *e, const char *hex)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return -1;
		e->ip[i] = (uint8_t)v;
	}
	return 0;
}

void ep_format(const struct ep *e, char *out, size_t len)
{
	static const struct ep unknown;
	char ip[INET6_ADDRSTRLEN];

	if (!memcmp(e, &unknown, sizeof(*e)))
		snprintf(out, len, "-");        /* not asked of the kernel */
	else if (ep_is_v4(e)) {
		inet_ntop(AF_INET, e->ip + 12, ip, sizeof(ip));
		snprintf(out, len, "%s:%u", ip, e->port);
	} else {
		inet_ntop(AF_INET6, e->ip, ip, sizeof(ip));
		snprintf(out, len, "[%s]:%u", ip, e->port);
	}
}

int ep_of_socket(int fd, int peer, struct ep *e)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	int rc = peer ? sys_getpeername(fd, &ss, &l) : sys_getsockname(fd, &ss, &l);

	return rc < 0 ? -1 : ep_from_sockaddr(e, (struct sockaddr *)&ss, l);
}
