/*
 * test_uring_abi.c - what shim/uring.c assumes of liburing and the kernel:
 *
 *  - its mirror of struct io_uring (src/shim/uring_abi.h) has every field
 *    it reads where the installed liburing.h puts it, and the liburing
 *    functions it stands in front of are declared as liburing declares
 *    them (both headers in one translation unit: a different prototype
 *    does not compile);
 *  - uring_nop_injects() (src/base/uring.c) says yes exactly on kernels
 *    that complete a NOP with the result it names (Linux 6.10 and later),
 *    and a ring liburing filled is read as liburing filled it.
 */
#include "check.h"

#include "uring.h"
#include "../../src/shim/uring_abi.h"

#include <liburing.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>

#define SAME(field) (offsetof(struct io_uring, field) == offsetof(struct lib_uring, field))

static int kernel_at_least(int major, int minor)
{
	struct utsname u;
	int ma = 0, mi = 0;

	if (uname(&u) < 0 || sscanf(u.release, "%d.%d", &ma, &mi) != 2)
		return 0;
	return ma > major || (ma == major && mi >= minor);
}

static void test_layout(void)
{
	CHECK(SAME(sq.khead));
	CHECK(SAME(sq.ktail));
	CHECK(SAME(sq.kring_mask));
	CHECK(SAME(sq.array));
	CHECK(SAME(sq.sqes));
	CHECK(SAME(sq.sqe_head));
	CHECK(SAME(sq.sqe_tail));
	CHECK(SAME(flags));
	CHECK(SAME(ring_fd));
	CHECK(SAME(features));
}

/* Two submissions liburing filled and has not published: where the
 * mirror says, in order. */
static void test_pending_read_as_filled(void)
{
	struct io_uring ring;
	struct lib_uring *m = (struct lib_uring *)&ring;
	struct io_uring_sqe *a, *b;

	if (io_uring_queue_init(4, &ring, 0) < 0) {
		printf("io_uring not allowed here: layout checked only\n");
		return;
	}
	a = io_uring_get_sqe(&ring);
	b = io_uring_get_sqe(&ring);
	io_uring_prep_nop(a);
	io_uring_prep_nop(b);
	CHECK(m->sq.sqe_tail - m->sq.sqe_head == 2);
	CHECK((char *)m->sq.sqes + ((size_t)(m->sq.sqe_head & *m->sq.kring_mask) << 6) ==
	      (char *)a);
	CHECK(m->ring_fd == ring.ring_fd);
	CHECK(io_uring_submit(&ring) == 2);
	CHECK(m->sq.sqe_head == m->sq.sqe_tail);
	io_uring_queue_exit(&ring);
}

int main(void)
{
	test_layout();
	test_pending_read_as_filled();
	CHECK(uring_nop_injects() == kernel_at_least(6, 10));
	return check_report("test_uring_abi");
}
