/*
 * config.c - environment settings (see config.h).
 */
#include "config.h"

#include "ring.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct smclo_config cfg;

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	switch (tolower((unsigned char)*end)) {
	case 'k': v <<= 10; end++; break;
	case 'm': v <<= 20; end++; break;
	case '\0': break;
	default: return -1;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0')
		return -1;
	*out = v;
	return 0;
}

void config_default_dir(char *out, size_t len)
{
	/* tmpfs, so registry files and rings never touch a disk */
	snprintf(out, len, "%s", SMCLO_SHARED_DIR);
}

void config_private_dir(char *out, size_t len)
{
	snprintf(out, len, "%s-%u", SMCLO_SHARED_DIR, (unsigned)geteuid());
}

static int env_flag(const char *name, int dflt, int *out, char *err, size_t errlen)
{
	const char *v = getenv(name);

	if (!v || !*v) {
		*out = dflt;
		return 0;
	}
	if (strcmp(v, "0") && strcmp(v, "1")) {
		snprintf(err, errlen, "%s=%s: expected 0 or 1", name, v);
		return -1;
	}
	*out = v[0] == '1';
	return 0;
}

static int env_ring(const char *name, uint32_t *out, char *err, size_t errlen)
{
	const char *v = getenv(name);
	uint64_t size;

	*out = SMCLO_DEFAULT_RING;
	if (!v || !*v)
		return 0;
	if (config_parse_size(v, &size) < 0 || !ring_size_valid(size)) {
		snprintf(err, errlen, "%s=%s: expected a power of two from 16k to 16m", name, v);
		return -1;
	}
	*out = (uint32_t)size;
	return 0;
}

static int env_int(const char *name, int dflt, int lo, int hi, int *out, char *err, size_t errlen)
{
	const char *v = getenv(name);
	char *end;
	long n;

	*out = dflt;
	if (!v || !*v)
		return 0;
	n = strtol(v, &end, 10);
	if (*end || n < lo || n > hi) {
		snprintf(err, errlen, "%s=%s: expected a number from %d to %d", name, v, lo, hi);
		return -1;
	}
	*out = (int)n;
	return 0;
}

/*
 * SMCLO_ALLOW_UIDS: unset or '*', peers of any user (each proving what the
 * kernel can vouch for, docs/security.md); "self", this user's only; a
 * list, this user's and the listed users', whom we also trust as our own.
 */
static int env_uids(struct smclo_config *c, char *err, size_t errlen)
{
	const char *v = getenv("SMCLO_ALLOW_UIDS");
	char buf[256], *tok, *save;

	c->allow_any_uid = 1;
	if (!v || !*v || strcmp(v, "*") == 0)
		return 0;
	c->allow_any_uid = 0;
	if (strcmp(v, "self") == 0)
		return 0;
	snprintf(buf, sizeof(buf), "%s", v);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		long u = strtol(tok, &end, 10);
		if (!isdigit((unsigned char)*tok) || *end || u < 0 || u > 0x7fffffffL ||
		    c->n_allow_uids == SMCLO_MAX_ALLOW_UIDS) {
			snprintf(err, errlen, "SMCLO_ALLOW_UIDS=%s: expected '*', 'self' or up to %d "
			         "comma-separated user ids", v, SMCLO_MAX_ALLOW_UIDS);
			return -1;
		}
		c->allow_uids[c->n_allow_uids++] = (uid_t)u;
	}
	return 0;
}

int config_load(struct smclo_config *c, char *err, size_t errlen)
{
	const char *dir = getenv("SMCLO_DIR");

	memset(c, 0, sizeof(*c));
	if (env_flag("SMCLO_DISABLE", 0, &c->disabled, err, errlen) < 0 ||
	    env_flag("SMCLO_DEBUG", 0, &c->debug, err, errlen) < 0 ||
	    env_flag("SMCLO_CROSS_NETNS", 1, &c->cross_netns, err, errlen) < 0 ||
	    env_flag("SMCLO_DIRECT", 0, &c->direct, err, errlen) < 0 ||
	    env_flag("SMCLO_INBOX", 1, &c->inbox, err, errlen) < 0 ||
	    env_flag("SMCLO_SHORT_LIVED", 1, &c->short_lived, err, errlen) < 0 ||
	    env_flag("SMCLO_IO_URING", 1, &c->io_uring, err, errlen) < 0 ||
	    env_ring("SMCLO_WMEM", &c->tx_size, err, errlen) < 0 ||
	    env_ring("SMCLO_RMEM", &c->rx_max, err, errlen) < 0 ||
	    env_int("SMCLO_HANDSHAKE_MS", SMCLO_DEFAULT_HANDSHAKE_MS, 1, 60000,
	            &c->handshake_ms, err, errlen) < 0 ||
	    env_int("SMCLO_MAX_CONNS", SMCLO_DEFAULT_MAX_CONNS, 0, 1000000,
	            &c->max_conns, err, errlen) < 0 ||
	    env_uids(c, err, errlen) < 0)
		return -1;
	if (dir && *dir) {
		if (dir[0] != '/' || strlen(dir) >= sizeof(c->dir) - 64) {
			snprintf(err, errlen, "SMCLO_DIR=%s: expected an absolute path shorter than %zu",
			         dir, sizeof(c->dir) - 64);
			return -1;
		}
		snprintf(c->dir, sizeof(c->dir), "%s", dir);
	} else {
		config_default_dir(c->dir, sizeof(c->dir));
		c->dir_is_default = 1;
	}
	return 0;
}

int config_uid_trusted(const struct smclo_config *c, uid_t uid)
{
	if (uid == geteuid())
		return 1;
	for (int i = 0; i < c->n_allow_uids; i++)
		if (c->allow_uids[i] == uid)
			return 1;
	return 0;
}

int config_uid_allowed(const struct smclo_config *c, uid_t uid)
{
	return c->allow_any_uid || config_uid_trusted(c, uid);
}
