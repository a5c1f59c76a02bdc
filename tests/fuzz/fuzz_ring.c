/*
 * fuzz_ring.c - the data path against a peer that writes anything into its
 * ring header: src/proto/ring.c (header check, cursor validation, copies across
 * the wrap) driven through the real readers and writers, rx.c, tx.c and
 * bell.c.
 *
 * Fuzzes: a connection whose peer ring header starts as the input says
 * (ring_hdr_check decides whether it is taken at all) and whose cursors may
 * start anywhere in the 64-bit space; then up to 64 steps, each either the
 * peer's (set its producer cursor, its consumer cursor of our stream, its
 * flags, its doorbell log and counts, its wait promises; send a doorbell,
 * send a byte where only doorbells belong, shut down or close its end of
 * the doorbell socket, drain our doorbells) or ours (rx_recv with
 * MSG_PEEK / MSG_WAITALL over 1-3 iovecs, tx_send, tx_sendfile from a file,
 * tx_send_pending under an offer word the input sets, rx_available,
 * rx_settle_bells, shutdown for reading, the native API's rx_peek and
 * rx_consume of a part, tx_claim and tx_commit of a part or tx_abort).
 * The peer also sends pool references (ring.h): it sets its reference
 * count and entries to anything - honest ones at our cursor or ahead,
 * forged ones behind us, outside the pool, empty - over a pool of ours that
 * the input may leave unmapped, and it may hand over descriptors with a
 * doorbell (a sealed pool with an eventfd, or not).  Everything is non-blocking, as for an
 * O_NONBLOCK descriptor.  Each ring is allocated on its own, header and
 * data area exactly, so ASan reports any access past a data area.
 *
 * Input: [sizes and options][header fields, if corrupted][start cursors,
 *        if chosen][steps: opcode, arguments...]
 *
 * Asserts, besides ASan/UBSan:
 *  - ring_hdr_check() accepts exactly the header our side set up;
 *  - a read returns at most what was asked, exactly the bytes of the
 *    stream from our position as ring.h defines it (model_stream(): the
 *    peer's data area and the pool hold known patterns; a reference is the
 *    pool's bytes in place of its placeholder byte), never past a forged
 *    reference, and moves our position by what it returned (not at all
 *    for MSG_PEEK); errors are EAGAIN or ECONNRESET;
 *  - a write or sendfile returns at most what was asked, puts exactly
 *    those bytes at our producer cursor and publishes it; a write while
 *    the handshake is pending takes all or nothing, only while the offer
 *    word is open and within PENDING_MAX;
 *  - a peek's span lies in the peer's data area or the pool (ASan: both
 *    are allocated exactly) and holds exactly the stream's next bytes; a
 *    consume moves our position by what it was told; a claim's span lies in our data area and a commit publishes
 *    exactly what was written there, an abort nothing; no lock stays held;
 *  - our cursors never leave the ring: a validated peer producer is at
 *    most one ring ahead of what we consumed, our producer at most one
 *    ring ahead of the peer consumer we validated; rx_available() is at
 *    most the ring.
 *
 * Known bug (found by this harness): a peer that sets its doorbell count
 * (bell_seq) far ahead of what we drained and then shuts down or closes
 * its end of the doorbell socket makes bell_drain() loop up to 2^62 times:
 * every recv() at end of file returns 0, which it counts as a doorbell.
 * SMCLO_FUZZ_SKIP_KNOWN=1 keeps the peer's count within 2^20 of ours.
 *
 * The connection's own machinery that needs a whole process of smclo
 * (conn.c, close.c, spin.c) is replaced by the few functions below, each
 * doing what the real one does for a non-blocking descriptor in a single
 * process; the data path's hooks (io_hooks) are left unset, as they are
 * only called before a sleep.
 */
#include "fuzz.h"

#include "io.h"
#include "peerpool.h"
#include "spin.h"
#include "sys.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ---- stand-ins for the rest of the library ---- */

void close_mark_broken(struct conn *c)         /* close.c */
{
	atomic_fetch_or(&c->sh->flags, SH_BROKEN);
}

void shared_lock(pthread_mutex_t *m)              /* conn.c */
{
	if (pthread_mutex_lock(m) == EOWNERDEAD)
		pthread_mutex_consistent(m);
}

void shared_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
}

/* spin.c: never spins for a non-blocking descriptor, which is all we drive */
int spin_for_change(int nonblock, uint32_t peer_cpu, const _Atomic uint64_t *word, uint64_t seen,
                    const _Atomic uint32_t *flags)
{
	return 0;
}

/* spin.c: where we run is no matter to a harness that never spins */
void spin_note_cpu(_Atomic uint32_t *slot)
{
	(void)slot;
}

/* ---- the harness ---- */

static const uint32_t sizes[] = { 16u << 10, 32u << 10, 64u << 10 };

static int file_fd = -1;                /* sendfile source: byte k is file_byte(k) */
#define FILE_LEN (128u << 10)

static uint8_t peer_byte(uint64_t off) { return (uint8_t)(off * 131 + 7); }
static uint8_t pool_byte(uint64_t off) { return (uint8_t)(off * 37 + 11); }

#define POOL_LEN (48u << 10)            /* the peer's pool, allocated exactly */
static uint8_t *pool;
static uint8_t file_byte(uint64_t off) { return (uint8_t)(off * 29 + 1); }

/*
 * The rings, one allocation each of exactly header + data area (so ASan
 * reports a byte past the data area), made once per size: the peer's data
 * area holds peer_byte() and nothing of ours ever writes it.
 */
static struct ring_hdr *rx_rings[3], *tx_rings[3];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	uint8_t *b = malloc(FILE_LEN);

	for (int k = 0; k < 3; k++) {
		rx_rings[k] = aligned_alloc(64, ring_region_len(sizes[k]));
		tx_rings[k] = aligned_alloc(64, ring_region_len(sizes[k]));
		for (uint32_t i = 0; i < sizes[k]; i++)
			ring_data(rx_rings[k])[i] = peer_byte(i);
	}

	pool = malloc(POOL_LEN);
	for (uint32_t i = 0; i < POOL_LEN; i++)
		pool[i] = pool_byte(i);
	file_fd = memfd_create("fuzz-sendfile", MFD_CLOEXEC);
	for (uint32_t k = 0; k < FILE_LEN; k++)
		b[k] = file_byte(k);
	if (file_fd < 0 || pwrite(file_fd, b, FILE_LEN, 0) != FILE_LEN)
		abort();
	free(b);
	return 0;
}

struct world {
	struct conn c;
	struct conn_shared sh;
	struct stat_slot slot;
	struct ring_hdr *rx, *tx;       /* the peer's ring, ours */
	int fd, peer;                   /* doorbell socket: our end, the peer's */
};

FUZZ_QUIET static void fill(uint8_t *buf, size_t n, unsigned mul, unsigned add)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = (uint8_t)(i * mul + add);
}

/*
 * The stream from position @at as ring.h defines it, independently of
 * rx.c: ring positions from our cursor to the producer, each a byte of the
 * peer's data area unless it is the placeholder of the next reference,
 * which stands for the reference's bytes of the pool instead.  Up to @n
 * bytes go to @out (NULL: only counted); *@forged is set when the walk
 * meets a reference a reader must refuse (behind us, empty, outside the
 * pool, or no pool at all) - the stream is not defined past it.  Also
 * returns, in *@end, the position after the bytes.
 */
struct pos {
	uint64_t cons, ref;
	uint32_t skip;
};

FUZZ_QUIET static size_t model_stream(struct world *w, struct pos at, uint8_t *out, size_t n,
                                      uint64_t prod, int *forged, struct pos *end)
{
	uint64_t refs = atomic_load(&w->rx->ref_prod);
	uint64_t plen = w->c.rx_pool ? w->c.rx_pool_len : 0;
	size_t got = 0;

	*forged = 0;
	if (refs - at.ref > RING_REFS || (refs == at.ref && at.skip))
		*forged = 1;
	while (!*forged && got < n && at.cons != prod) {
		if (refs != at.ref) {
			const struct ring_ref *e = &w->rx->ref[at.ref % RING_REFS];
			uint64_t pos = atomic_load(&e->pos);
			uint32_t off = atomic_load(&e->off), len = atomic_load(&e->len);

			if (pos == at.cons) {
				if (len == 0 || at.skip >= len || (uint64_t)off + len > plen) {
					*forged = 1;
					break;
				}
				while (got < n && at.skip < len) {
					if (out)
						out[got] = w->c.rx_pool[off + at.skip];
					got++;
					at.skip++;
				}
				if (at.skip == len) {
					at.skip = 0;
					at.ref++;
					at.cons++;
				}
				continue;
			}
			/* behind us (in the unsigned distance from our cursor) */
			if (pos - at.cons > (uint64_t)RING_MAX_SIZE || at.skip) {
				*forged = 1;
				break;
			}
		}
		if (out)
			out[got] = peer_byte(at.cons & (w->c.rx_size - 1));
		got++;
		at.cons++;
	}
	*end = at;
	return got;
}

static void invariants(struct world *w)
{
	struct conn_shared *sh = &w->sh;

	FUZZ_CHECK(sh->peer_prod_seen - sh->cons <= w->c.rx_size);
	FUZZ_CHECK(sh->prod - sh->peer_cons_seen <= w->c.tx_size);
	FUZZ_CHECK(atomic_load(&w->tx->prod) == sh->prod);
}

/* Split @total bytes at @buf into 1-3 iovecs as the input says. */
static int make_iov(struct in *in, uint8_t *buf, size_t total, struct iovec iov[3])
{
	int n = 1 + take_u8(in) % 3;
	size_t off = 0;

	for (int i = 0; i < n; i++) {
		size_t len = i == n - 1 ? total - off : (total - off) * take_u8(in) / 255;
		iov[i].iov_base = buf + off;
		iov[i].iov_len = len;
		off += len;
	}
	return n;
}

static struct pos our_pos(struct world *w)
{
	return (struct pos){ w->sh.cons, w->sh.ref_cons, w->sh.ref_skip };
}

/* Is our position @p? */
static int at_pos(struct world *w, struct pos p)
{
	return w->sh.cons == p.cons && w->sh.ref_cons == p.ref && w->sh.ref_skip == p.skip;
}

/* Where @n bytes of the stream from @from end, as the model walks it. */
static struct pos model_after(struct world *w, struct pos from, size_t n, uint64_t prod)
{
	struct pos end;
	int forged;

	model_stream(w, from, NULL, n, prod, &forged, &end);
	return end;
}

/* The peer's producer cursor as the library reads it: a sealed one (the
 * stream goes on over TCP after it, core/move.c) stands for its value. */
static uint64_t peer_prod_now(struct world *w)
{
	uint64_t prod = atomic_load(&w->rx->prod);

	return ring_prod_sealed(prod, w->sh.cons, w->c.rx_size) ? prod - RING_PROD_MOVED : prod;
}

/* FIONREAD: the stream's bytes up to the producer, or up to a forged
 * reference on the way (the read after those resets). */
static void step_available(struct world *w)
{
	uint64_t prod = peer_prod_now(w);
	int valid = ring_prod_valid(w->sh.cons, w->sh.peer_prod_seen, prod, w->c.rx_size), forged;
	struct pos end;
	size_t can;
	uint32_t n = rx_available(&w->c);

	if (!valid) {
		FUZZ_CHECK(n == 0);
		return;
	}
	/* a valid producer is at most a ring ahead: the walk is bounded */
	can = model_stream(w, our_pos(w), NULL, UINT32_MAX, prod, &forged, &end);
	FUZZ_CHECK(n == can);   /* up to a forged reference, if any */
}

static void step_read(struct world *w, struct in *in)
{
	size_t total = take_u16(in) % (2 * w->c.rx_size + 1);
	uint8_t how = take_u8(in);
	int flags = MSG_DONTWAIT | (how & 1 ? MSG_PEEK : 0) | (how & 2 ? MSG_WAITALL : 0) |
	            (how == 0xff ? MSG_OOB : 0);
	uint8_t *buf = malloc(total ? total : 1), *want = malloc(total ? total : 1);
	struct iovec iov[3];
	int n = make_iov(in, buf, total, iov), forged;
	struct pos start = our_pos(w), end;
	uint64_t prod = peer_prod_now(w);
	size_t can = model_stream(w, start, want, total, prod, &forged, &end);
	ssize_t r;

	errno = 0;
	r = rx_recv(&w->c, w->fd, iov, n, flags);
	if (r > 0) {
		FUZZ_CHECK((size_t)r <= total && (size_t)r <= can);
		FUZZ_CHECK(memcmp(buf, want, (size_t)r) == 0);
		FUZZ_CHECK(at_pos(w, how & 1 ? start : model_after(w, start, (size_t)r, prod)));
		(void)end;
	} else if (r < 0) {
		FUZZ_CHECK(r == -EAGAIN || r == -ECONNRESET || (flags & MSG_OOB));
		FUZZ_CHECK(at_pos(w, start));
	} else {
		FUZZ_CHECK(at_pos(w, start));
	}
	free(buf);
	free(want);
}

FUZZ_QUIET static void check_written(struct world *w, uint64_t at, const uint8_t *src, size_t n)
{
	const uint8_t *d = ring_data(w->tx);
	/* more than a ring in one call: the peer claimed, before the call, to
	 * have consumed bytes the call then wrote - the writer fetches its
	 * cursor only when short of room, and by then the claim is true.  Its
	 * own stream is overwritten, nothing else: the last ring of it is here */
	size_t skip = n > w->c.tx_size ? n - w->c.tx_size : 0;

	for (size_t i = skip; i < n; i++)
		FUZZ_CHECK(d[(at + i) & (w->c.tx_size - 1)] == src[i]);
}

static void step_write(struct world *w, struct in *in)
{
	size_t total = take_u16(in) % (2 * w->c.tx_size + 1);
	uint8_t seed = take_u8(in);
	int oob = seed == 0xff ? MSG_OOB : 0;
	uint8_t *buf = malloc(total ? total : 1);
	struct iovec iov[3];
	int n = make_iov(in, buf, total, iov);
	uint64_t start = w->sh.prod;
	ssize_t r;

	fill(buf, total, 17, seed);
	errno = 0;
	r = tx_send(&w->c, w->fd, iov, n, MSG_DONTWAIT | MSG_NOSIGNAL | oob);
	if (r > 0 && w->sh.prod == start) {
		/* a write to a peer that closed: taken and dropped, as TCP takes
		 * it, and the reset it draws latched (core/tcpend.c) */
		FUZZ_CHECK((size_t)r == total && tcpend_reset(&w->c));
	} else if (r > 0) {
		FUZZ_CHECK((size_t)r <= total);
		FUZZ_CHECK(w->sh.prod == start + (uint64_t)r);
		check_written(w, start, buf, (size_t)r);
	} else {
		FUZZ_CHECK(w->sh.prod == start);
		if (r < 0)
			FUZZ_CHECK(r == -EAGAIN || r == -ECONNRESET || r == -EPIPE || oob);
	}
	free(buf);
}

/* The in-place read of the native API: rx_peek, then rx_consume of a part. */
static void step_peek(struct world *w, struct in *in)
{
	size_t min = take_u16(in) % (w->c.rx_size + 2);
	struct pos start = our_pos(w), end;
	uint64_t prod = peer_prod_now(w);
	struct iovec iov[2];
	int forged;
	long r;

	r = rx_peek(&w->c, w->fd, min, iov, 1);
	if (r > 0) {
		size_t n = (size_t)(take_u16(in) % ((uint64_t)r + 1));
		uint8_t *copy = malloc((size_t)r), *want = malloc((size_t)r);
		size_t can = model_stream(w, start, want, (size_t)r, prod, &forged, &end);
		const uint8_t *p0 = iov[0].iov_base;

		/* fewer than asked only where the stream ends (an end, or a reset
		 * whose error was taken), or at the edge of a reference's bytes (a
		 * peek shows one run in one place) */
		FUZZ_CHECK((size_t)r >= (min ? min : 1) ||
		           atomic_load(&w->rx->flags) & (RING_F_SHUTDOWN | RING_F_CLOSED) ||
		           atomic_load(&w->sh.flags) & (SH_SHUT_RD | SH_PEER_SHUT) ||
		           tcpend_reset(&w->c) ||
		           atomic_load(&w->rx->ref_prod) != start.ref);
		FUZZ_CHECK(iov[0].iov_len + iov[1].iov_len == (size_t)r);
		/* in the pool (one piece), or in the ring (at most the ring) */
		if (w->c.rx_pool && p0 >= w->c.rx_pool && p0 < w->c.rx_pool + w->c.rx_pool_len)
			FUZZ_CHECK(iov[1].iov_len == 0 && p0 + r <= w->c.rx_pool + w->c.rx_pool_len);
		else
			FUZZ_CHECK((size_t)r <= w->c.rx_size);
		/* every byte where the span says, inside its area (ASan) */
		memcpy(copy, iov[0].iov_base, iov[0].iov_len);
		if (iov[1].iov_len)     /* an empty second piece may be NULL */
			memcpy(copy + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
		FUZZ_CHECK(can == (size_t)r && memcmp(copy, want, (size_t)r) == 0);
		free(copy);
		free(want);
		rx_consume(&w->c, w->fd, n);
		FUZZ_CHECK(at_pos(w, model_after(w, start, n, prod)));
	} else {
		FUZZ_CHECK(r == 0 || r == -EAGAIN || r == -ECONNRESET || r == -EMSGSIZE);
		FUZZ_CHECK(r != -EMSGSIZE || min > w->c.rx_size);
		FUZZ_CHECK(at_pos(w, start));
	}
	FUZZ_CHECK(!io_hold_mine(&w->c.rx_hold));
}

/* The in-place write of the native API: tx_claim, then commit a part or abort. */
static void step_claim(struct world *w, struct in *in)
{
	size_t min = take_u16(in) % (w->c.tx_size + 2);
	uint8_t how = take_u8(in);
	uint64_t start = w->sh.prod;
	struct iovec iov[2];
	long r;

	r = tx_claim(&w->c, w->fd, min, iov, 1);
	if (r > 0) {
		size_t n = (size_t)(take_u16(in) % ((uint64_t)r + 1));
		uint8_t *buf = malloc((size_t)r);

		FUZZ_CHECK((size_t)r >= (min ? min : 1) && (size_t)r <= w->c.tx_size);
		FUZZ_CHECK(iov[0].iov_len + iov[1].iov_len == (size_t)r);
		FUZZ_CHECK(io_hold_mine(&w->c.tx_hold));
		fill(buf, (size_t)r, 29, how);
		memcpy(iov[0].iov_base, buf, iov[0].iov_len);          /* inside the area (ASan) */
		memcpy(iov[1].iov_base, buf + iov[0].iov_len, iov[1].iov_len);
		if (how & 1) {
			tx_abort(&w->c);
			FUZZ_CHECK(w->sh.prod == start);
		} else {
			tx_commit(&w->c, w->fd, n);
			FUZZ_CHECK(w->sh.prod == start + n);
			check_written(w, start, buf, n);
		}
		free(buf);
	} else {
		FUZZ_CHECK(r == 0 || r == -ECONNRESET || r == -EPIPE || r == -EMSGSIZE);
		FUZZ_CHECK(r != -EMSGSIZE || min > w->c.tx_size);
		FUZZ_CHECK(w->sh.prod == start);
	}
	FUZZ_CHECK(!io_hold_mine(&w->c.tx_hold));
}

/*
 * A write while the handshake is pending (tx_send_pending, client.c):
 * the offer word is the server's to set, so it is the input's.  A pending
 * connection is a new one: nothing of ours consumed yet, cursors from 0.
 */
static void step_pending(struct world *w, struct in *in)
{
	size_t total = take_u16(in) % (PENDING_MAX + 2);
	uint32_t offer = take_u8(in) % 8;
	uint8_t *buf = malloc(total ? total : 1);
	struct iovec iov[3];
	int n = make_iov(in, buf, total, iov);
	uint64_t start = w->sh.prod;
	ssize_t r;

	if (w->sh.peer_cons_seen != 0 || w->sh.prod > PENDING_MAX) {
		free(buf);
		return;
	}
	fill(buf, total, 5, 1);
	atomic_store(&w->tx->offer, offer);
	atomic_store(&w->c.pending, PENDING_OPEN);
	w->c.pending_until_ms = mono_now_ms() + 60000;
	w->c.bell_fd = w->fd;
	r = tx_send_pending(&w->c, iov, n);
	atomic_store(&w->c.pending, PENDING_NONE);
	w->c.bell_fd = -1;
	if (r >= 0) {
		FUZZ_CHECK((size_t)r == total && offer <= OFFER_OPEN_SLEEP);
		FUZZ_CHECK(w->sh.prod == start + total && start + total <= PENDING_MAX);
		check_written(w, start, buf, total);
	} else {
		FUZZ_CHECK(r == -1 && w->sh.prod == start);
	}
	free(buf);
}

static void step_sendfile(struct world *w, struct in *in)
{
	size_t count = take_u16(in) % (2 * w->c.tx_size + 1);
	off_t off = take_u16(in), from = off;
	uint64_t start = w->sh.prod;
	ssize_t r;

	errno = 0;
	r = tx_sendfile(&w->c, w->fd, file_fd, &off, count);
	if (r > 0) {
		uint8_t *want = malloc((size_t)r);

		FUZZ_CHECK((size_t)r <= count && off == from + r);
		FUZZ_CHECK(w->sh.prod == start + (uint64_t)r);
		fill(want, (size_t)r, 29, (unsigned)(from * 29 + 1));     /* file_byte(from + i) */
		check_written(w, start, want, (size_t)r);
		free(want);
	} else {
		FUZZ_CHECK(w->sh.prod == start);
	}
}

static void step_peer_ref(struct world *w, struct in *in)
{
	struct ring_ref *e = &w->rx->ref[take_u8(in) % RING_REFS];
	uint8_t k = take_u8(in);
	uint64_t base = k & 1 ? w->sh.cons : atomic_load(&w->rx->prod);

	atomic_store(&e->pos, k & 2 ? take_u64(in) : base + (uint64_t)(int64_t)(int16_t)take_u16(in));
	atomic_store(&e->off, k & 4 ? take_u32(in) : take_u16(in));
	atomic_store(&e->len, k & 8 ? take_u32(in) : take_u16(in) % 4096);
}

/* What pool.c does: the entry, its count, the placeholder byte produced. */
static void step_peer_honest_ref(struct world *w, struct in *in)
{
	uint64_t prod = atomic_load(&w->rx->prod), refs = atomic_load(&w->rx->ref_prod);
	struct ring_ref *e = &w->rx->ref[refs % RING_REFS];
	uint32_t len = 1 + take_u16(in) % 8192;

	atomic_store(&e->pos, prod);
	atomic_store(&e->off, take_u16(in) % (POOL_LEN - len + 1));
	atomic_store(&e->len, len);
	atomic_store(&w->rx->ref_prod, refs + 1);
	atomic_store(&w->rx->prod, prod + 1);
}

/*
 * Descriptors with a doorbell, as a pool is handed over (peerpool.c takes
 * them when it drains the doorbell): a memfd sealed (fully, or but for new
 * writable mappings) or not, a SEQPACKET socket, an eventfd or a pipe, one
 * or two or three of them.  Only taken while no pool is mapped.
 */
static void step_peer_fds(struct world *w, struct in *in)
{
	uint8_t k = take_u8(in);
	int fds[3], n = 1 + k % 3, p[2] = { -1, -1 }, s[2] = { -1, -1 };
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(fds))];
	} u;
	struct msghdr m = { .msg_control = u.buf, .msg_controllen = CMSG_SPACE(n * sizeof(int)) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	uint64_t seq = atomic_load(&w->rx->bell_seq);

	if (w->peer < 0)
		return;
	fds[0] = memfd_create("fuzz-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fds[0] < 0 || ftruncate(fds[0], k & 8 ? 0 : 8192) < 0 || pipe(p) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, s) < 0)
		abort();
	if (k & 16)
		fcntl(fds[0], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL |
		                           (k & 128 ? 0 : F_SEAL_FUTURE_WRITE));
	fds[1] = k & 32 ? p[0] : k & 64 ? eventfd(0, EFD_CLOEXEC) : s[1];
	fds[2] = p[1];
	memset(&u, 0, sizeof(u));
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(n * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
	atomic_store(&w->rx->bell_val[seq % BELL_LOG], atomic_load(&w->rx->prod));
	atomic_store(&w->rx->bell_seq, seq + 1);
	/* says which doorbell carries it, as bell_send_pool does (the
	 * reader may take it before the ring empties); other steps move
	 * the count on, truthfully or not */
	atomic_store(&w->rx->pool_bell, seq + 1);
	sendmsg(w->peer, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	close(fds[0]);
	close(p[0]);
	close(p[1]);
	close(s[0]);
	close(s[1]);
	if (!(k & 32) && (k & 64))
		close(fds[1]);
}

static void step_peer(struct world *w, struct in *in, int op)
{
	struct ring_hdr *rx = w->rx;
	char b;

	switch (op) {
	case 0:         /* producer cursor moves by a signed amount */
		atomic_store(&rx->prod, atomic_load(&rx->prod) + (uint64_t)(int64_t)(int32_t)take_u32(in));
		break;
	case 1:
		atomic_store(&rx->prod, take_u64(in));
		break;
	case 2:         /* consumer cursor of our stream moves by a signed amount */
		atomic_store(&rx->cons, atomic_load(&rx->cons) + (uint64_t)(int64_t)(int32_t)take_u32(in));
		break;
	case 3:
		atomic_store(&rx->cons, take_u64(in));
		break;
	case 4:         /* honest: consumed all we wrote */
		atomic_store(&rx->cons, w->sh.prod);
		break;
	case 5:
		atomic_store(&rx->flags, take_u32(in));
		break;
	case 6: {       /* the doorbell log and counts */
		uint8_t k = take_u8(in);
		if (k & 1) {
			uint64_t v = take_u64(in);
			if (!fuzz_skip_known() || v - w->sh.bells_drained <= (1u << 20) ||
			    v - w->sh.bells_drained > (1ull << 62))
				atomic_store(&rx->bell_seq, v);
		} else
			atomic_store(&rx->bell_seq, w->sh.bells_drained + (k >> 1) % 40);
		atomic_store(&rx->bell_val[take_u8(in) % BELL_LOG], take_u64(in));
		atomic_store(&rx->bells_drained, w->sh.bell_seq - take_u8(in));
		break;
	}
	case 7: {       /* the promises of the peer's waits */
		uint32_t v = take_u32(in);
		switch (take_u8(in) % 5) {
		case 0: atomic_store(&rx->write_blocked, v); break;
		case 1: atomic_store(&rx->spin_take, v); break;
		case 2: atomic_store(&rx->watchers, v); break;
		case 3: atomic_store(&rx->sleepers, v); break;
		case 4: atomic_store(&rx->futex_take, v); break;
		}
		break;
	}
	case 8:
		/*
		 * A doorbell, counted and logged first as bell.c does - or, for
		 * one argument value only, not: a reader then loops until its
		 * bound of 100000 idle looks (rx.c), a hostile peer's cost of a
		 * few hundred milliseconds that would otherwise be most of the
		 * fuzzing time.
		 */
		if (take_u8(in) != 0x5a) {
			uint64_t seq = atomic_load(&rx->bell_seq);
			atomic_store(&rx->bell_val[seq % BELL_LOG], atomic_load(&rx->prod));
			atomic_store(&rx->bell_seq, seq + 1);
		}
		if (w->peer >= 0)
			send(w->peer, NULL, 0, MSG_DONTWAIT | MSG_NOSIGNAL);
		break;
	case 9:         /* a byte where only doorbells belong */
		if (w->peer >= 0)
			send(w->peer, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		break;
	case 10:
		if (w->peer >= 0)
			shutdown(w->peer, SHUT_WR);
		break;
	case 11:
		if (w->peer >= 0)
			close(w->peer);
		w->peer = -1;
		break;
	case 12:        /* honest: take our doorbells and say so */
		while (w->peer >= 0 && recv(w->peer, &b, 1, MSG_DONTWAIT) >= 0)
			;
		atomic_store(&rx->bells_drained, w->sh.bell_seq);
		break;
	case 13:        /* a reference entry: anywhere, or near our cursor / the producer */
		step_peer_ref(w, in);
		break;
	case 14: {      /* the reference count */
		uint8_t k = take_u8(in);
		atomic_store(&rx->ref_prod, k & 1 ? take_u64(in) : w->sh.ref_cons + (k >> 1) % 70);
		break;
	}
	case 15:        /* honest: one reference at the producer, its placeholder produced */
		step_peer_honest_ref(w, in);
		break;
	case 16:        /* descriptors with a doorbell */
		step_peer_fds(w, in);
		break;
	}
}

/* (New operations go after the ones above only with a new PEER_OPS, which
 * changes what every corpus input means: the regression inputs too.) */
#define PEER_OPS 17

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint8_t opt = take_u8(&in);
	int rxk = (opt & 3) % 3, txk = ((opt >> 2) & 3) % 3;
	uint32_t rx_size = sizes[rxk], tx_size = sizes[txk];
	struct world *w = calloc(1, sizeof(*w));
	struct conn_shared *sh = &w->sh;
	uint64_t rb = 0, tb = 0;
	int sp[2], accepted;

	w->rx = rx_rings[rxk];
	w->tx = tx_rings[txk];
	ring_hdr_init(w->rx, rx_size);
	ring_hdr_init(w->tx, tx_size);
	if (opt & 16) {         /* a header of the peer's making */
		w->rx->magic = take_u32(&in);
		w->rx->version = take_u32(&in);
		w->rx->data_size = take_u32(&in);
		w->rx->hdr_size = take_u32(&in);
	}
	accepted = ring_hdr_check(w->rx, rx_size) == 0;
	FUZZ_CHECK(accepted == (w->rx->magic == RING_MAGIC && w->rx->version == RING_VERSION &&
	                        w->rx->data_size == rx_size && w->rx->hdr_size == RING_HDR_SIZE));
	if (!accepted || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) < 0)
		goto out;
	if (opt & 32) {         /* anywhere in the 64-bit space, near the wrap included */
		rb = take_u64(&in);
		tb = take_u64(&in);
	}
	pthread_mutex_init(&sh->tx_lock, NULL);
	pthread_mutex_init(&sh->rx_lock, NULL);
	sh->cons = sh->cons_pub = sh->cons_woke = sh->peer_prod_seen = rb;
	sh->prod = sh->peer_cons_seen = tb;
	atomic_store(&sh->holders, 1);
	atomic_store(&sh->nonblock, 1);
	atomic_store(&w->rx->prod, rb);
	atomic_store(&w->rx->cons, tb);
	atomic_store(&w->tx->prod, tb);
	atomic_store(&w->tx->cons, rb);
	w->c.refs = 1;
	w->c.mode = MODE_SHM;
	w->c.tcp_fd = -1;
	w->c.bell_fd = -1;
	w->c.tx = w->tx;
	w->c.rx = w->rx;
	w->c.tx_size = tx_size;
	w->c.rx_size = rx_size;
	w->c.sh = sh;
	w->c.slot = opt & 64 ? &w->slot : NULL;
	w->c.pool_wake_fd = -1;
	if (opt & 128) {        /* the peer's pool is mapped already */
		w->c.rx_pool = pool;
		w->c.rx_pool_len = POOL_LEN;
	}
	w->fd = sp[0];
	w->peer = sp[1];

	for (int steps = 0; steps < 64 && in.n > 0; steps++) {
		int op = take_u8(&in) % (PEER_OPS + 9);

		if (op < PEER_OPS)
			step_peer(w, &in, op);
		else if (op == PEER_OPS)
			step_read(w, &in);
		else if (op == PEER_OPS + 1)
			step_write(w, &in);
		else if (op == PEER_OPS + 2)
			step_sendfile(w, &in);
		else if (op == PEER_OPS + 3)
			step_available(w);
		else if (op == PEER_OPS + 4)
			rx_settle_bells(&w->c, w->fd);
		else if (op == PEER_OPS + 5)
			step_pending(w, &in);
		else if (op == PEER_OPS + 6)
			step_peek(w, &in);
		else if (op == PEER_OPS + 7)
			step_claim(w, &in);
		else            /* shutdown(SHUT_RD) as close.c does it: reads end */
			atomic_fetch_or(&sh->flags, SH_SHUT_RD);
		invariants(w);
	}
	close(w->fd);
	if (w->peer >= 0)
		close(w->peer);
	if (w->c.rx_pool == pool)
		w->c.rx_pool = NULL;
	peerpool_drop(&w->c);   /* one the peer handed over, and its eventfd */
	pthread_mutex_destroy(&sh->tx_lock);
	pthread_mutex_destroy(&sh->rx_lock);
out:
	free(w);
	return 0;
}
