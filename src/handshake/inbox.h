/*
 * inbox.h - the one-message handshake, through the inbox of the process that
 * accepts.
 *
 * Every process that listens through smclo binds one datagram socket, its
 * inbox (i/<pid>.<id>), and names it in its listener entries.  When every
 * live entry for the address a client connects to names the same inbox,
 * exactly one process accepts there, and the client sends its whole offer to
 * that inbox before its SYN leaves: the socket pair end that becomes the
 * server's descriptor, its region (both rings) and its TCP socket as proof.
 * The server picks the offer up when accept() returns that connection and
 * decides it with one compare-and-swap on the offer word in the region,
 * which the client watches; no message goes back.  Compared with the
 * rendezvous handshake (client.c, server.c) that is one leg instead of three and
 * no file created per connection.
 *
 * Deciding exactly once: the word starts OPEN; the server moves it to TAKEN
 * or DECLINED, a client that gives up moves it to WITHDRAWN, and whoever
 * swaps first decides.  An offer the server never sees (another process
 * accepted after all, the server crashed) is withdrawn when the client's
 * wait of SMCLO_HANDSHAKE_MS ends; the client's descriptor is still its TCP
 * socket then, so nothing is lost.
 *
 * The word sits in the client's memory, so a hostile client can set it to
 * anything: the server only ever trusts its own successful swap, and a
 * hostile server can at worst make its client wait out the timeout.
 */
#ifndef SMCLO_INBOX_H
#define SMCLO_INBOX_H

#include "addr.h"
#include "clc.h"
#include "peerid.h"
#include "registry.h"
#include "ring.h"

/* The offer word's states (OFFER_*) are in ring.h, beside the word. */

/* Descriptors an offer carries, in this order. */
enum { OFFER_FD_TCP, OFFER_FD_PAIR, OFFER_FD_REGION, OFFER_FDS };

/* ---- server ---- */

/* This process's inbox, bound on first use; the id listeners name, 0 if none. */
uint64_t inbox_id(void);
/*
 * The inbox this fork child inherited from its parent (the parent's own,
 * or the one it inherited in turn), which the child reads too and names in
 * its entries for listeners that defer accept: its id (0 if none), and the
 * pid in its name at @pid.  inbox_fork_prepare, in the parent before
 * fork(): from then on offers it reads that are not its own are parked
 * where its children look too, instead of in its stash (see inbox.c).
 */
uint64_t inbox_inherited(int *pid);
/* The same in the fork child's handler, which holds inbox.c's lock since
 * hs_fork_lock (inbox_inherited would wait for it for ever). */
uint64_t inbox_inherited_forking(int *pid);
/* ...and closed there, when no listener of the child names it. */
void inbox_inherited_drop_forking(void);
void inbox_fork_prepare(void);

/*
 * 0 when no offer can be waiting here: none stashed, and none sent to any
 * inbox since this one was last found empty.  1 when one may be.
 */
int inbox_may_hold_offer(void);

/*
 * The offer for the accepted connection @local <- @peer, if its client sent
 * one here: the message and its descriptors (the caller closes them).  The
 * offered TCP socket's addresses are the mirror of @local and @peer.
 * Returns 0, or -1 if there is none.
 */
int inbox_take(const struct ep *local, const struct ep *peer, union clc_msg *m,
               int fds[OFFER_FDS]);

/*
 * A listener's direct inbox (direct.c): every message
 * there is a CLC_DIRECT offer for listener @lfd, bound to @addr in
 * namespace @netns.  Open binds it and returns the id its listener entry
 * names (0 if it cannot); the socket is -1 when @lfd has none (else the
 * listener's address and namespace come with it); close unnames it, hands
 * every offer still queued to @refuse (which closes the descriptors) and
 * closes it.
 */
uint64_t inbox_direct_open(int lfd, const struct ep *addr, uint64_t netns);
int inbox_direct_sock(int lfd, struct ep *addr, uint64_t *netns);
void inbox_direct_close(int lfd, void (*refuse)(const union clc_msg *m, int fds[OFFER_FDS]));

/*
 * Decide an open offer: @state is OFFER_TAKEN or OFFER_DECLINED | reason << 8.
 * Returns 0 if the decision is ours, -1 if the client withdrew first.
 */
int inbox_offer_decide(struct ring_hdr *up, uint32_t state);

/* ---- client ---- */

/*
 * The link to inbox @id of @li's process (li->offer.inbox, or
 * li->offer.direct for a CLC_DIRECT), connected now if needed, as the key
 * of whoever receives what goes through it (PEERID_LINK, peerid.h): the
 * key its region is reused under.  PEERID_NONE if there is no such inbox
 * or its owner is a user we may not attach to.
 */
peerid inbox_link(const struct listener_info *li, uint64_t id);
/*
 * Send @m with @fds to that inbox through link @via (inbox_link's answer);
 * 0 once queued there, else -1 (also if the link was replaced meanwhile:
 * the region was made for that link's receiver only).
 */
int inbox_send(const struct listener_info *li, uint64_t id, peerid via, const union clc_msg *m,
               const int fds[OFFER_FDS]);

/*
 * Wait until the server decides the offer in @up or @deadline_ms passes
 * (then withdraw it).  Returns the final word: OFFER_TAKEN, OFFER_DECLINED |
 * reason, or OFFER_WITHDRAWN; or OFFER_OPEN at @look_ms (0: none), if that
 * comes first, for the caller to look elsewhere and wait again.
 */
uint32_t inbox_offer_wait(struct ring_hdr *up, long deadline_ms, long look_ms);
/*
 * The same for a client blocked in a read: after the spin it sleeps until
 * the server's first bytes (or a decline, or a close) rather than until the
 * decision, so a loaded machine wakes it once per connection, not twice.
 * @take is what the read would take, as rx.c's futex_take promise.
 * *@interrupted: a signal whose handler does not restart reads came (the
 * decision is then waited for without it).
 */
uint32_t inbox_offer_wait_reading(struct ring_hdr *up, uint32_t take, long deadline_ms,
                                  long look_ms, int *interrupted);
/* Give up on the offer now; returns the decision if the server was first. */
uint32_t inbox_offer_withdraw(struct ring_hdr *up);

/* At start (runtime/init.c), before any handshake. */
void inbox_init(void);
/* inbox_lock, then links_lock: held across fork() (hs_fork_lock). */
void inbox_fork_lock(void);
void inbox_fork_unlock(void);

#endif
