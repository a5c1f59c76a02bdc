/*
 * test_decisions.c - the handshake's decisions that do not need a peer
 * process (src/handshake/), one behaviour each: an inbox offer is decided
 * once, by whichever of the server's take (or decline) and the client's
 * withdrawal swaps the offer word first, and the loser learns what the
 * winner decided; a decline carries its reason; a client waiting for a
 * decision is woken by it, and one whose wait runs out withdraws and never
 * waits longer; a word a hostile server left that is no state of ours is
 * neither taken nor waited on for ever; a destination on this host is told
 * from one that is not; and a descriptor released by a process leaves the
 * table with the reference it held.
 */
#include "check.h"

#include "hs_internal.h"
#include "inbox.h"
#include "reason.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ring_hdr *open_offer(void)
{
	struct ring_hdr *h = aligned_alloc(64, ring_region_len(16u << 10));

	ring_hdr_init(h, 16u << 10);
	atomic_store(&h->offer, OFFER_OPEN);
	return h;
}

static void test_server_first(void)
{
	struct ring_hdr *h = open_offer();

	CHECK(inbox_offer_decide(h, OFFER_TAKEN) == 0);
	CHECK(inbox_offer_decide(h, OFFER_TAKEN) == -1);        /* decided once */
	CHECK(inbox_offer_withdraw(h) == OFFER_TAKEN);          /* the client learns it */
	free(h);
}

static void test_client_first(void)
{
	struct ring_hdr *h = open_offer();

	CHECK(inbox_offer_withdraw(h) == OFFER_WITHDRAWN);
	CHECK(inbox_offer_decide(h, OFFER_TAKEN) == -1);        /* the server stays on TCP */
	free(h);
}

static void test_decline_says_why(void)
{
	struct ring_hdr *h = open_offer();
	uint32_t w;

	CHECK(inbox_offer_decide(h, OFFER_DECLINED | (uint32_t)R_IO_URING << 8) == 0);
	w = inbox_offer_wait(h, mono_now_ms() + 1000, 0);
	CHECK(OFFER_STATE(w) == OFFER_DECLINED && OFFER_REASON(w) == R_IO_URING);
	free(h);
}

static void *decide_later(void *arg)
{
	usleep(20000);
	inbox_offer_decide(arg, OFFER_TAKEN);
	return NULL;
}

static void test_waiter_is_woken(void)
{
	struct ring_hdr *h = open_offer();
	long t0 = mono_now_ms();
	pthread_t t;

	pthread_create(&t, NULL, decide_later, h);
	CHECK(inbox_offer_wait(h, t0 + 5000, 0) == OFFER_TAKEN);
	CHECK(mono_now_ms() - t0 < 2500);        /* woken, not timed out */
	pthread_join(t, NULL);
	free(h);
}

static void test_wait_runs_out(void)
{
	struct ring_hdr *h = open_offer();
	long t0 = mono_now_ms();

	CHECK(inbox_offer_wait(h, t0 + 50, 0) == OFFER_WITHDRAWN);
	CHECK(mono_now_ms() - t0 < 2000);
	CHECK(inbox_offer_decide(h, OFFER_TAKEN) == -1);        /* too late for the server */
	free(h);
}

/* A look before the deadline returns the word still open, withdraws
 * nothing, and the next wait goes on: a reading wait too, which gives its
 * READING state back (the server then wakes the futex of a plain wait). */
static void test_wait_looks(void)
{
	struct ring_hdr *h = open_offer();
	long t0 = mono_now_ms();
	int intr;

	CHECK(inbox_offer_wait(h, t0 + 5000, t0 + 20) == OFFER_OPEN);
	CHECK(mono_now_ms() - t0 < 2000);
	CHECK(inbox_offer_wait_reading(h, 100, t0 + 5000, mono_now_ms() + 20, &intr) == OFFER_OPEN);
	CHECK(atomic_load(&h->offer) == OFFER_OPEN || atomic_load(&h->offer) == OFFER_OPEN_SLEEP);
	CHECK(inbox_offer_decide(h, OFFER_TAKEN) == 0);         /* still the server's to take */
	CHECK(inbox_offer_wait(h, t0 + 5000, mono_now_ms() + 20) == OFFER_TAKEN);
	free(h);
}

static void test_hostile_word(void)
{
	struct ring_hdr *h = open_offer();
	long t0 = mono_now_ms();

	atomic_store(&h->offer, 0x77u);         /* no state of ours */
	CHECK(inbox_offer_decide(h, OFFER_TAKEN) == -1);
	CHECK(inbox_offer_wait(h, t0 + 50, 0) == OFFER_WITHDRAWN);
	CHECK(mono_now_ms() - t0 < 2000);
	free(h);
}

static int local(const char *ip, int v6)
{
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons(80) };
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(80) };
	struct ep e;

	if (v6) {
		inet_pton(AF_INET6, ip, &a6.sin6_addr);
		ep_from_sockaddr(&e, (struct sockaddr *)&a6, sizeof(a6));
	} else {
		inet_pton(AF_INET, ip, &a4.sin_addr);
		ep_from_sockaddr(&e, (struct sockaddr *)&a4, sizeof(a4));
	}
	return proof_dst_is_local(&e);
}

static void test_this_host(void)
{
	CHECK(local("127.0.0.1", 0));
	CHECK(local("127.3.4.5", 0));           /* all of 127/8 is loopback */
	CHECK(local("::1", 1));
	CHECK(!local("192.0.2.1", 0));          /* TEST-NET-1: never an address of ours */
	CHECK(!local("2001:db8::1", 1));        /* the documentation prefix */
}

static void test_release(void)
{
	int sp[2];
	struct conn *c = conn_alloc(MODE_TCP);

	socketpair(AF_UNIX, SOCK_STREAM, 0, sp);
	CHECK(fdtab_init() == 0);
	fd_bind_conn(c, sp[0]);
	conn_put(c);                            /* the table's reference is the only one */
	CHECK(conn_count() == 1 && fd_has_conn(sp[0]));
	hs_release_fd(sp[0]);
	CHECK(!fd_has_conn(sp[0]) && conn_count() == 0);
	hs_release_fd(sp[0]);                   /* nothing bound: nothing happens */
	close(sp[0]);
	close(sp[1]);
}

int main(void)
{
	test_server_first();
	test_client_first();
	test_decline_says_why();
	test_waiter_is_woken();
	test_wait_runs_out();
	test_wait_looks();
	test_hostile_word();
	test_this_host();
	test_release();
	return check_report("test_decisions");
}
