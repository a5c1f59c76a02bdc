/*
 * ring.h - the shared-memory region each side of a connection owns.
 *
 * Every accelerated connection has one region (region.h) holding two rings,
 * one per direction; each ring starts with a header that carries the cursor
 * block (the kernel's CDC message, kept in memory instead of being sent):
 * the owner's producer cursor for its data, the owner's consumer cursor for
 * the peer's data, shutdown / close / abort flags, the "write blocked"
 * request, what the owner's waits promise the writer (spin_take, watchers,
 * sleepers) and the doorbell log.  Both sides can write the whole region, so
 * every field is only the peer's word.
 *
 * The header is laid out in cache lines by who writes what how often: the
 * producer line (the owner writes it per message, the peer's reader spins
 * on it), the consumer line (the owner writes it per read; the writer
 * fetches it only when it runs short of room or rings), the promise line
 * (the owner's waits write it, the writer looks at it after each produce)
 * and the doorbell log.  A line both sides write per message goes back and
 * forth between their CPUs, at about 130 ns a trip on a small VM: one
 * such trip saved is a tenth of a ping-pong's round trip.
 *
 * Cursors are 64-bit byte counts that only grow; the position in the data
 * area is the cursor modulo the (power of two) size, so wrap-around of both
 * the position and the 64-bit counter itself is plain unsigned arithmetic.
 * Everything read from the peer's region goes through the checks below.
 */
#ifndef SMCLO_RING_H
#define SMCLO_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define RING_MAGIC      0x4f4c4d53u   /* "SMLO" */
#define RING_VERSION    2u   /* 2: the promise line apart from the consumer cursor */
#define RING_HDR_SIZE   4096u
#define RING_MIN_SIZE   (16u << 10)
#define RING_MAX_SIZE   (16u << 20)
#define BELL_LOG        32u            /* doorbell values remembered */
#define RING_REFS       64u            /* pool references unconsumed at most */
#define POOL_MAX_LEN    (1u << 30)     /* the largest pool a reader maps */

/* Flags the owner raises about the data it sends. */
#define RING_F_SHUTDOWN 1u   /* no data after fin_prod (shutdown(SHUT_WR)) */
#define RING_F_CLOSED   2u   /* last holder closed the connection */
#define RING_F_ABORT    4u   /* closed with unread data: peer sees ECONNRESET */
#define RING_F_MOVED    8u   /* the stream goes on over TCP: nothing is published in the ring
                                after the sealed producer cursor (core/move.c) */
#define RING_PREFIX_SET (1ull << 63)  /* tcp_prefix: the client's first bytes are sent */
/* Added to a producer cursor, with a compare-and-swap, to seal it: no more
 * bytes are published in that ring (core/move.c).  A sealed cursor is told
 * from a live one by its distance from the consumer's: 2^63 is far beyond
 * any ring size. */
#define RING_PROD_MOVED (1ull << 63)

struct ring_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t data_size;
	uint32_t hdr_size;
	/* producer line: the owner's outgoing stream */
	_Alignas(64) _Atomic uint64_t prod;
	_Atomic uint64_t fin_prod;
	_Atomic uint32_t flags;
	_Atomic uint64_t ref_prod;          /* pool references the owner sent (ref[]) */
	_Atomic uint64_t pool_bell;         /* doorbells counted up to and with the one
	                                       that carried the owner's pool (0: none) */
	_Atomic uint32_t pool_wake_wanted;  /* 1: the owner has pool buffers out and has
	                                       not looked since: the peer's next release
	                                       wakes it (and clears this) */
	/* consumer line: the owner's progress on the peer's stream (the
	 * writer reads it when it runs short of room, or rings) */
	_Alignas(64) _Atomic uint64_t cons;
	_Atomic uint32_t cpu;               /* the CPU the owner last read or wrote on,
	                                       plus one (0: not known): a waiter spins
	                                       only while its peer runs elsewhere (spin.h) */
	/* promise line: what the owner's waits promise the writer, which looks
	 * at it after every produce; a line apart from the cursor, so that a
	 * reader's cursor moves without taking the line back from the writer */
	_Alignas(64) _Atomic uint32_t write_blocked;     /* owner waits for space: drain bells */
	_Atomic uint32_t spin_take;         /* owner is spinning in a blocking read that
	                                       takes up to this many bytes (0: not) */
	_Atomic uint32_t watchers;          /* owner's epoll waits watching this ring:
	                                       they report new bytes themselves (epoll_watch.c) */
	_Atomic uint32_t sleepers;          /* owner's waits asleep in the kernel on the
	                                       doorbell socket: they need a doorbell */
	_Atomic uint32_t futex_take;        /* owner sleeps on wake_seq in a read that
	                                       takes up to this many bytes (0: not) */
	_Atomic uint32_t wake_seq;          /* futex word: the writer bumps it to wake */
	_Atomic uint32_t pool_ack;          /* 1: the owner mapped the peer's pool, so
	                                       the peer may send references (pool.c) */
	_Atomic uint32_t no_tcp;            /* 1: the owner keeps no TCP socket beneath
	                                       (closed under a small descriptor budget):
	                                       it cannot follow a move (core/move.c).  Not
	                                       a flag: spinners wake at any flag */
	_Atomic uint32_t bell_each;         /* 1: the owner wants a doorbell for every
	                                       produce, as TCP raises an edge-triggered
	                                       epoll event (or SIGIO) at every arrival */
	_Atomic uint32_t lowat;             /* the owner's SO_RCVLOWAT (0, 1: none): it
	                                       wants a doorbell when the bytes it has not
	                                       read reach it, as TCP wakes its reader */
	/* doorbells the owner sent (value = owner's prod when it rang) */
	_Alignas(64) _Atomic uint64_t bell_seq;
	_Atomic uint64_t bells_drained;     /* doorbells the owner consumed */
	_Atomic uint64_t bell_val[BELL_LOG];
	/* client->server ring only: the offer word of the inbox handshake (inbox.h,
	 * states OFFER_* below) */
	_Alignas(64) _Atomic uint32_t offer;
	/* client->server ring, an offer to a listener that defers accept: the
	 * bytes of the stream the client sent over TCP before the decision
	 * (they wake the server), with RING_PREFIX_SET once they are sent; the
	 * server moves them to the head of this ring when it takes the offer */
	_Atomic uint64_t tcp_prefix;
	/* pool references (ref_prod counts them): reference i stands in the
	 * stream at the one placeholder byte at ref[i % RING_REFS].pos, for the
	 * @len bytes at offset @off of the owner's pool (rx.c reads them) */
	_Alignas(64) struct ring_ref {
		_Atomic uint64_t pos;
		_Atomic uint32_t off;
		_Atomic uint32_t len;
	} ref[RING_REFS];
	/* a hand-on (core/move.c, "sent again"): RING_RESEND_SET | the owner's
	 * consumer cursor, from which it reads nothing more of the peer's
	 * stream in the ring (its next reader reads the TCP socket alone):
	 * the peer sends it again over TCP; asked before the owner seals */
	_Alignas(64) _Atomic uint64_t resend;
	/* RESENT_*: the owner sent again what the peer asked for */
	_Atomic uint32_t resent;
};
#define RING_RESEND_SET (1ull << 63)
#define RESENT_DONE 1u
#define RESENT_FAILED 2u     /* could not: the TCP connection is reset */

_Static_assert(sizeof(struct ring_hdr) <= RING_HDR_SIZE, "ring header too big");

static inline uint8_t *ring_data(struct ring_hdr *h)
{
	return (uint8_t *)h + RING_HDR_SIZE;
}

static inline const uint8_t *ring_data_ro(const struct ring_hdr *h)
{
	return (const uint8_t *)h + RING_HDR_SIZE;
}

/* A valid data size: a power of two within [RING_MIN_SIZE, RING_MAX_SIZE]. */
int ring_size_valid(uint64_t size);

/* Round a requested size to the valid size at or above it (clamped). */
uint32_t ring_size_round(uint64_t size);

/* Total bytes of a region with a data area of @size. */
static inline size_t ring_region_len(uint32_t size)
{
	return (size_t)RING_HDR_SIZE + size;
}

void ring_hdr_init(struct ring_hdr *h, uint32_t size);

/* 0 if a mapped peer header is sane for a region of @expect_size, else -1. */
int ring_hdr_check(const struct ring_hdr *h, uint32_t expect_size);

/*
 * A producer cursor @prod read from the peer is acceptable when it has not
 * moved backwards from @last_prod and the peer has not produced more than
 * @size bytes beyond our consumer cursor @cons.
 */
int ring_prod_valid(uint64_t cons, uint64_t last_prod, uint64_t prod, uint32_t size);

/*
 * A consumer cursor @peer_cons read from the peer is acceptable when it lies
 * between the last value we saw and our producer cursor @prod.
 */
int ring_cons_valid(uint64_t last_cons, uint64_t peer_cons, uint64_t prod);

/* Is the producer cursor @raw sealed (RING_PROD_MOVED), the consumer at @cons? */
static inline int ring_prod_sealed(uint64_t raw, uint64_t cons, uint32_t size)
{
	return raw - RING_PROD_MOVED - cons <= size;
}

/* Bytes free for the producer, given the consumer's cursor. */
static inline uint32_t ring_space(uint64_t prod, uint64_t cons, uint32_t size)
{
	return size - (uint32_t)(prod - cons);
}

/* Copy into / out of a ring at stream position @pos, splitting at the wrap. */
void ring_copy_in(uint8_t *data, uint32_t size, uint64_t pos, const void *src, size_t len);
void ring_copy_out(void *dst, const uint8_t *data, uint32_t size, uint64_t pos, size_t len);

/*
 * Contiguous run of the ring starting at @pos of at most @len bytes (the part
 * before the wrap), for callers that fill the ring directly (sendfile).
 */
static inline size_t ring_contig(uint32_t size, uint64_t pos, size_t len)
{
	size_t off = (size_t)(pos & (size - 1));
	size_t run = size - off;
	return len < run ? len : run;
}

/* The @len bytes of a data area of @size from stream position @pos, as one
 * piece or two where the ring wraps (@iov[1] empty otherwise). */
static inline void ring_pieces(uint8_t *data, uint32_t size, uint64_t pos, size_t len,
                               struct iovec iov[2])
{
	size_t run = ring_contig(size, pos, len);

	iov[0] = (struct iovec){ data + (pos & (size - 1)), run };
	iov[1] = (struct iovec){ data, len - run };
}

/*
 * Where a pool reference read from the peer leaves a reader at stream
 * position @cons (with @skip bytes of the reference at @cons taken
 * already), the peer's producer at @prod and its pool @pool_len bytes long
 * (0: none mapped).  The reference's fields are the caller's copy, read
 * once.
 */
enum ref_state {
	REF_LATER,      /* its placeholder is not produced yet: plain bytes up to @prod */
	REF_AHEAD,      /* plain bytes up to its placeholder, then the reference */
	REF_HERE,       /* the reference is next: @len - @skip bytes at @off + @skip */
	REF_BAD,        /* forged: before our cursor, empty, or outside the pool */
};
enum ref_state ring_ref_check(uint64_t pos, uint32_t off, uint32_t len, uint64_t cons,
                              uint32_t skip, uint64_t prod, uint64_t pool_len);

/* States of the offer word (ring_hdr.offer of the client->server ring): the
 * server takes or declines an inbox offer by swapping it (inbox.h). */
#define OFFER_NONE       0u     /* not an inbox handshake */
#define OFFER_OPEN       1u
#define OFFER_OPEN_SLEEP 2u     /* still open, and the client sleeps on the word */
#define OFFER_TAKEN      3u
#define OFFER_WITHDRAWN  4u
#define OFFER_DECLINED   5u     /* | reason << 8 */
/*
 * Still open, and the client sleeps in a read, on its ring's wake_seq: a
 * server that takes the offer need not wake it, the answer it writes will.
 */
#define OFFER_OPEN_READING 6u

#define OFFER_STATE(w)   ((w) & 0xffu)
#define OFFER_REASON(w)  ((int)((w) >> 8))

#endif
