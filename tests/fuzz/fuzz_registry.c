/*
 * fuzz_registry.c - listener entry names as anyone who may write the
 * registry can make them: l/<port>.<netns>.<ip>.<flags>.<pid>.<inbox>.
 * <direct>.<tx>.<rx>.<rand>, parsed by registry_listener_find() and swept
 * by registry_gc() (src/registry/registry.c).
 *
 * The parser itself (parse_listener_name) is static, so this harness goes
 * through the public function that calls it, on a registry of its own:
 * every input is a destination to look up and up to 16 entry names, each
 * created in l/ either held (its owner's lock taken, as registry_lock_create
 * does) or dead (no lock), then looked up, optionally collected, removed.
 *
 * Input: [dst port, 2][dst ip, 16][our netns cookie, 8][options]
 *        then lines: [liveness byte][name bytes...]\n ...
 *        ('/' and NUL, which no file name holds, become '_')
 *
 * Asserts, besides ASan/UBSan:
 *  - the answer is one of the listener_match values; an exclusive answer
 *    is a same-namespace one that names an inbox; no answer (LM_NONE)
 *    names no process, inbox or ring sizes;
 *  - a same-namespace, other-namespace, defer or unreachable answer needs
 *    a live entry: one whose lock is held (a dead entry never makes a
 *    client offer, nor keeps it on TCP);
 *  - registry_port_unlistened() says "nobody listens on the port" only
 *    when the lookup answered LM_NONE (the harness counts its entries as
 *    added listeners, as registry_listener_add() does);
 *  - neither the lookup nor the collection removes an entry whose lock is
 *    held.
 */
#include "fuzz.h"

#include "registry.h"

#include <errno.h>

#define NAMES_MAX 16

static int dirfd_ = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = fuzz_tmpdir("registry");
	char err[512];

	dirfd_ = registry_open(dir, 0, err, sizeof(err));
	if (dirfd_ < 0) {
		fprintf(stderr, "fuzz_registry: %s\n", err);
		abort();
	}
	return 0;
}

struct entry {
	char name[256];
	int lock;               /* held: its lock descriptor; dead: -1 */
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	struct entry e[NAMES_MAX];
	struct listener_info info;
	struct ep dst;
	uint64_t netns;
	uint8_t opt;
	int n = 0, any_live = 0;

	take(&in, &dst.port, sizeof(dst.port));
	take(&in, dst.ip, sizeof(dst.ip));
	netns = take_u64(&in);
	opt = take_u8(&in);
	while (in.n > 0 && n < NAMES_MAX) {
		uint8_t live = take_u8(&in);
		size_t len = 0;
		char path[REGISTRY_PATH_MAX];
		struct entry *x = &e[n];

		while (in.n > 0 && in.p[0] != '\n') {
			uint8_t ch = take_u8(&in);
			if (len < sizeof(x->name) - 1)
				x->name[len++] = (ch == '/' || ch == 0) ? '_' : (char)ch;
		}
		take_u8(&in);           /* the newline */
		x->name[len] = '\0';
		if (len == 0 || !strcmp(x->name, ".") || !strcmp(x->name, ".."))
			continue;
		if (live & 1) {
			x->lock = registry_lock_create(dirfd_, "l", x->name);
			if (x->lock < 0)
				continue;       /* a name given twice, or too long for a path */
			any_live = 1;
		} else {
			int fd;
			if (registry_entry_path(path, "l", x->name) < 0)
				continue;
			fd = openat(dirfd_, path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
			if (fd < 0)
				continue;
			close(fd);
			x->lock = -1;
		}
		n++;
	}

	/* count the entries as registry_listener_add() would have: add one, drop it */
	{
		struct ep none = { .port = 0 };
		int lock = registry_listener_add(dirfd_, &none, 0, 0, NULL);
		FUZZ_CHECK(lock >= 0);
		registry_lock_remove(dirfd_, "l", lock);
		FUZZ_CHECK(!registry_port_unlistened(dirfd_, dst.port));
	}
	registry_listener_find(dirfd_, &dst, netns, &info);
	FUZZ_CHECK(info.m >= LM_NONE && info.m <= LM_UNREACHABLE);
	if (info.exclusive)
		FUZZ_CHECK(info.m == LM_SAME_NETNS && info.offer.inbox != 0);
	if (info.m == LM_NONE) {
		FUZZ_CHECK(!info.exclusive && info.pid == 0 && info.offer.inbox == 0 &&
		           info.offer.direct == 0 && info.offer.tx_size == 0 &&
		           info.offer.rx_max == 0);
	}
	if (registry_port_unlistened(dirfd_, dst.port))
		FUZZ_CHECK(info.m == LM_NONE);
	if (info.m >= LM_DEFER)
		FUZZ_CHECK(any_live);
	if (opt & 1)
		registry_gc(dirfd_);

	for (int i = 0; i < n; i++) {
		char path[REGISTRY_PATH_MAX];
		struct stat st;

		FUZZ_CHECK(registry_entry_path(path, "l", e[i].name) == 0);
		if (e[i].lock >= 0) {
			FUZZ_CHECK(fstatat(dirfd_, path, &st, AT_SYMLINK_NOFOLLOW) == 0);
			registry_lock_remove(dirfd_, "l", e[i].lock);
		} else {
			unlinkat(dirfd_, path, 0);
		}
	}
	return 0;
}
