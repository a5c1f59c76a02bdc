/*
 * region.h - the shared memory of accelerated connections, reused across
 * connections between the same two processes (the page_frag idea,
 * docs/background.md section 2, and the kernel's DMB reuse).
 *
 * A region holds both rings of one connection: the client->server ring
 * ("up") and the server->client ring ("down"), each a 4 KiB header and a
 * power-of-two data area.  The client creates it (a sealed memfd: fixed size,
 * so no SIGBUS) and hands it to the server, which maps it.
 *
 * Reuse without leaks: a region is only ever handed to one peer process (a
 * key the kernel vouches for, which holds across PID namespaces: peerid.h),
 * so everything it ever held was meant for that process.  It is taken again only once every holder of the
 * old connection is gone on our side and the server has published CLOSED in
 * the down ring, so the server no longer reads or writes it.  The server
 * keeps the mapping of a recently seen region and recognises the same memfd
 * (device and inode) next time, so neither side maps, unmaps or faults in
 * pages per connection once warm.
 */
#ifndef SMCLO_REGION_H
#define SMCLO_REGION_H

#include "peerid.h"
#include "ring.h"

#include <stdint.h>
#include <sys/types.h>

struct region;

/* Client: a region for a connection to @peer (PEERID_NONE: not reused). */
struct region *region_get(peerid peer, uint32_t up, uint32_t down, int *memfd);
/* Server: map the client's region from @memfd; *owner is its creator's uid. */
struct region *region_map(int memfd, uint32_t up, uint32_t down, uid_t *owner);
/*
 * A connection of this process is done with @r.  @reusable: every holder of
 * the connection, in every process, is gone.
 */
void region_put(struct region *r, int reusable);

/* Server: @pid made this region (its idle mapping goes when @pid is gone; 0: not known). */
void region_note_maker(struct region *r, pid_t pid);
/* Close the memfd kept with @r (install_go_lean); a region of ours is not reused then. */
void region_drop_memfd(struct region *r);
/* Its memfd, to hand the connection to an exec'd program; -1 if not kept. */
int region_memfd(const struct region *r);
/*
 * A region an exec'd predecessor of this process used (handover.c): mapped
 * from @memfd, checked like a peer's (sealed, exact size), never reused.
 */
struct region *region_adopt(int memfd, uint32_t up, uint32_t down, int mine);

/* Did this process create @r (the client's side)? */
int region_mine(const struct region *r);

struct ring_hdr *region_up(struct region *r);
struct ring_hdr *region_down(struct region *r);

/* The region pool's lock, held across fork() (runtime/fork.c lists the order). */
void region_fork_lock(void);
void region_fork_unlock(void);

#endif
