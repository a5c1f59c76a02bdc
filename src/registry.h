/*
 * registry.h - the directory through which smclo processes find each other.
 *
 * Layout under SMCLO_DIR (default /dev/shm/smclo-<uid>, mode 0700):
 *   l/<port>.<netns>.<ip>.<flags>.<pid>.<rand>  a listener; locked while alive
 *   p/<dstport>-<srcport>-<dstip>[.c|.ok|.tcp]   a proposal and its fate
 *   s/<process table name>-<tid>                  a thread's side socket
 *   c/<pid>.<rand>                                a process's connection table
 *   stats                                         totals since creation/reset
 *
 * Liveness is an open-file-description lock held by the owner: it is
 * inherited over fork, released by the kernel when the last holder exits,
 * and visible across PID namespaces, so a crashed owner is noticed without
 * trusting process ids.  Decisions on a proposal are renames, which the
 * filesystem makes atomic: exactly one side's rename succeeds.
 */
#ifndef SMCLO_REGISTRY_H
#define SMCLO_REGISTRY_H

#include "addr.h"
#include "clc.h"

#include <stdint.h>
#include <sys/types.h>

#define LISTEN_F_V6ONLY 1u
#define LISTEN_F_DEFER  2u

/* Open (creating if needed) the registry; returns a directory fd or -1. */
int registry_open(const char *dir, int is_default, char *err, size_t errlen);

/* Mode for files in the registry (the directory's, without execute bits). */
mode_t registry_file_mode(void);

/* Lock files: create @name under @sub and hold an OFD lock; returns fd. */
int registry_lock_create(int dirfd, const char *sub, const char *name);
/* 1 if someone holds the lock on @sub/@name, 0 if not, -1 if it is gone. */
int registry_is_locked(int dirfd, const char *sub, const char *name);

/* Listener entries. */
int registry_listener_add(int dirfd, const struct ep *addr, uint64_t netns, unsigned flags);

enum listener_match {
	LM_NONE,          /* nothing listens on the port through smclo */
	LM_ELSEWHERE,     /* something does, but not at this address / namespace */
	LM_DEFER,         /* it does, with TCP_DEFER_ACCEPT */
	LM_SAME_NETNS,
	LM_OTHER_NETNS,
};
enum listener_match registry_listener_find(int dirfd, const struct ep *dst, uint64_t my_netns);

/* Proposal key of a TCP connection, from the client's view. */
void registry_proposal_key(char *out, size_t len, const struct ep *dst, uint16_t src_port);

/* Publish atomically; -1 with errno EEXIST if the key is taken. */
int registry_proposal_put(int dirfd, const char *key, const struct clc_proposal *p);
/* 0 and *p filled, or -1 (errno ENOENT when there is no proposal). */
int registry_proposal_get(int dirfd, const char *key, union clc_msg *p);

/* The atomic steps.  Each returns 0 when this caller's step took effect. */
int registry_proposal_claim(int dirfd, const char *key);        /* key -> key.c   */
int registry_proposal_withdraw(int dirfd, const char *key);     /* unlink key     */
int registry_proposal_decide(int dirfd, const char *key, int ok); /* key.c -> key.ok|.tcp */
int registry_proposal_drop_claim(int dirfd, const char *key);   /* unlink key.c   */
int registry_proposal_was_ok(int dirfd, const char *key);       /* key.ok exists  */
void registry_proposal_cleanup(int dirfd, const char *key);     /* unlink final   */

/* "/proc/self/fd/<dirfd>/<sub>/<name>", short enough for sun_path. */
int registry_sun_path(int dirfd, const char *sub, const char *name, char *out, size_t len);

/* Call @fn for each entry of @sub ("." and ".." skipped) until it returns non-zero. */
typedef int (*registry_visit_fn)(int dirfd, const char *sub, const char *name, void *arg);
void registry_for_each(int dirfd, const char *sub, registry_visit_fn fn, void *arg);

/* Remove entries of dead owners and stale proposals. */
void registry_gc(int dirfd);

#endif
