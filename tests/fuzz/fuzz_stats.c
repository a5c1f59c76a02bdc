/*
 * fuzz_stats.c - other processes' statistics files as `smclo stat` and
 * `smclo stats` read them: connection tables c/<pid>.<rand> and totals
 * t/<uid> (src/registry/stats.c), and the listing of each table slot
 * (print_rows, src/cli/stat.c).
 *
 * Anyone who may write the registry can write these files, and they are
 * read (pread into a copy), never mapped.  Every input makes one table -
 * its header and up to 8 slots from the input, the rest of its 4096 slots
 * zero - held by its "owner" (its lock taken, so it is listed) or dead (no
 * lock, so it is folded into our totals and removed), and one totals file
 * of another uid with any length and contents.  Then: stats_collect_dead,
 * stats_for_each through print_rows (text or JSON, to /dev/null),
 * stats_totals_sum, stats_fallbacks, stats_fallback_not_short_lived.
 *
 * print_rows is static: this file includes src/cli/stat.c to reach it.
 *
 * Input: [options][table header, 16][slot count][slots, 112 each...]
 *        [totals file bytes...]
 *
 * Asserts, besides ASan/UBSan:
 *  - a dead table is folded and gone; a held one stays;
 *  - the sum counts exactly our own totals file and the other one when it
 *    is whole and of this layout (magic, version), and each counter of the
 *    sum is the two files' counters added up.
 */
#include "fuzz.h"

#include "../../src/cli/stat.c"

#include <errno.h>

/* src/cli/main.c, which also holds main() */
int usage_error(const char *fmt, ...)
{
	return 2;
}

static int dirfd_ = -1;
static struct stats_totals *mine;
static struct stat_table *table;        /* the file's contents, built per input */

#define OTHER_UID "4242424"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = fuzz_tmpdir("stats");
	char err[512];
	int null = open("/dev/null", O_WRONLY | O_CLOEXEC);

	/* the listing goes nowhere; libFuzzer reports on stderr */
	if (null < 0 || dup2(null, STDOUT_FILENO) < 0)
		abort();
	close(null);
	dirfd_ = registry_open(dir, 0, err, sizeof(err));
	if (dirfd_ < 0 || !(mine = stats_totals_map(dirfd_))) {
		fprintf(stderr, "fuzz_stats: %s\n", dirfd_ < 0 ? err : "no totals");
		abort();
	}
	table = calloc(1, sizeof(*table));
	return 0;
}

/* The counters stats_totals_sum adds up (stats.h). */
#define COUNTERS_MAX (3 + STATS_REASONS + 12)
static int counters(struct stats_totals *t, uint64_t c[COUNTERS_MAX])
{
	int n = 0;

	for (int i = 0; i < 3; i++)
		c[n++] = atomic_load(&t->accelerated[i]);
	for (int i = 0; i < STATS_REASONS; i++)
		c[n++] = atomic_load(&t->fallback[i]);
	c[n++] = atomic_load(&t->handshake_errors);
	c[n++] = atomic_load(&t->tx_bytes);
	c[n++] = atomic_load(&t->rx_bytes);
	c[n++] = atomic_load(&t->conns_closed);
	c[n++] = atomic_load(&t->regions_created);
	c[n++] = atomic_load(&t->regions_reused);
	c[n++] = atomic_load(&t->bells_sent);
	c[n++] = atomic_load(&t->bells_skipped);
	c[n++] = atomic_load(&t->inbox_handshakes);
	c[n++] = atomic_load(&t->peer_regions_mapped);
	c[n++] = atomic_load(&t->peer_regions_kept);
	c[n++] = atomic_load(&t->direct_handshakes);
	return n;
}

/* One slot listed as `smclo stat` lists a row (no peer looked up). */
static void print_one(const struct stat_slot *s, int json)
{
	struct row w = { .s = *s };
	struct rows r = { .v = &w, .n = 1, .cap = 1 };

	print_rows(&r, json);
}

static void print_text(const struct stat_slot *s, void *arg)
{
	print_one(s, 0);
}

static void print_json(const struct stat_slot *s, void *arg)
{
	print_one(s, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint8_t opt = take_u8(&in);
	int live = opt & 1, nslots;
	struct stats_totals before, other, sum;
	uint64_t c_before[COUNTERS_MAX], c_other[COUNTERS_MAX], c_sum[COUNTERS_MAX];
	size_t other_len;
	int lock, other_whole, n, files;
	struct stat st;

	/* the table: header and the first slots from the input, the rest zero */
	memset(table, 0, 16 + 8 * sizeof(struct stat_slot));
	take(&in, table, 16);
	nslots = take_u8(&in) % 9;
	take(&in, table->slots, nslots * sizeof(struct stat_slot));
	if (live) {
		lock = registry_lock_create(dirfd_, "c", "1.fuzz");
	} else {
		lock = openat(dirfd_, "c/1.fuzz", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
	}
	FUZZ_CHECK(lock >= 0);
	/* full size, only the part from the input written (the rest reads as zero) */
	FUZZ_CHECK(ftruncate(lock, sizeof(*table)) == 0);
	FUZZ_CHECK(pwrite(lock, table, 16 + nslots * sizeof(struct stat_slot), 0) ==
	           (ssize_t)(16 + nslots * sizeof(struct stat_slot)));
	if (!live) {
		close(lock);
		lock = -1;
	}

	/* another user's totals: whatever the rest of the input is */
	other_len = in.n < sizeof(other) + 64 ? in.n : sizeof(other) + 64;
	memset(&other, 0, sizeof(other));
	memcpy(&other, in.p, other_len < sizeof(other) ? other_len : sizeof(other));
	{
		int fd = openat(dirfd_, "t/" OTHER_UID, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
		FUZZ_CHECK(fd >= 0);
		FUZZ_CHECK(write(fd, in.p, other_len) == (ssize_t)other_len);
		close(fd);
	}
	other_whole = other_len >= sizeof(other) && other.magic == STATS_MAGIC &&
	              other.version == STATS_VERSION;

	stats_collect_dead(dirfd_, mine);
	FUZZ_CHECK((fstatat(dirfd_, "c/1.fuzz", &st, 0) == 0) == live);
	stats_for_each(dirfd_, opt & 2 ? print_json : print_text, NULL);

	before = *mine;
	files = stats_totals_sum(dirfd_, &sum);
	FUZZ_CHECK(files == 1 + other_whole);
	n = counters(&before, c_before);
	counters(&other, c_other);
	counters(&sum, c_sum);
	for (int i = 0; i < n; i++)
		FUZZ_CHECK(c_sum[i] == c_before[i] + (other_whole ? c_other[i] : 0));
	(void)stats_fallbacks(&sum);
	(void)stats_fallback_not_short_lived(&sum);

	if (lock >= 0)
		registry_lock_remove(dirfd_, "c", lock);
	unlinkat(dirfd_, "t/" OTHER_UID, 0);
	return 0;
}
