/*
 * config.h - settings read from the environment.
 *
 * The library reads them once at load; `smclo run` validates the same
 * settings with the same parser before it starts a program, so a mistake is
 * reported on the command line instead of inside the program.
 */
#ifndef SMCLO_CONFIG_H
#define SMCLO_CONFIG_H

#include <stdint.h>
#include <sys/types.h>

#define SMCLO_DEFAULT_RING (1u << 20)     /* measured with `smclo bench`: docs/performance.md */
#define SMCLO_DEFAULT_HANDSHAKE_MS 300
#define SMCLO_DEFAULT_MAX_CONNS 5000      /* the kernel's loopback-ism DMB limit */
#define SMCLO_MAX_ALLOW_UIDS 16
/* The host's registry, shared by every user (docs/security.md); made by root
 * (tmpfiles.d, `make install`, or any program root runs under smclo) */
#define SMCLO_SHARED_DIR "/dev/shm/smclo"

struct smclo_config {
	int disabled;
	int debug;
	char dir[256];              /* registry directory */
	int dir_is_default;
	uint32_t tx_size;           /* ring we send with (smc_run -t) */
	uint32_t rx_max;            /* largest ring we map from a peer (smc_run -r) */
	int handshake_ms;
	int max_conns;
	int cross_netns;
	int direct;                 /* blocking listeners take connections without TCP: an
	                               opt-in (SMCLO_DIRECT=1), since such a connection has
	                               no TCP to move to (docs/semantics.md §1) */
	int inbox;                  /* clients offer through a single acceptor's inbox */
	int short_lived;            /* keep short-lived connections on TCP when CPUs are busy */
	int io_uring;               /* pools' kernel zero copy by io_uring SEND_ZC */
	int allow_any_uid;          /* peers of any user (SMCLO_ALLOW_UIDS unset or '*') */
	int n_allow_uids;           /* users trusted as our own (SMCLO_ALLOW_UIDS=list) */
	uid_t allow_uids[SMCLO_MAX_ALLOW_UIDS];
};

extern struct smclo_config cfg;

/*
 * Fill @c from the environment.  On a bad value, writes a message naming the
 * variable to @err and returns -1.
 */
int config_load(struct smclo_config *c, char *err, size_t errlen);

/* "64k", "1m", "65536" -> bytes; -1 if malformed. */
int config_parse_size(const char *s, uint64_t *out);

/* The default registry (SMCLO_SHARED_DIR), and this user's own, used where
 * no usable shared one exists (registry_open). */
void config_default_dir(char *out, size_t len);
void config_private_dir(char *out, size_t len);

/*
 * May a peer of user @uid be accelerated with us?  Any user by default;
 * only our own and the listed ones under SMCLO_ALLOW_UIDS.
 */
int config_uid_allowed(const struct smclo_config *c, uid_t uid);
/*
 * Is @uid as good as ourselves: our effective user or a listed one?  What
 * such a user wrote is believed without the kernel's word (a listener
 * entry, a hand-over record); any other user must prove it (security.md).
 */
int config_uid_trusted(const struct smclo_config *c, uid_t uid);

#endif
