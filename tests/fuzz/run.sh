#!/usr/bin/env bash
#
# tests/fuzz/run.sh - build smclo's libFuzzer harnesses and run each in turn.
#
#   tests/fuzz/run.sh [SECONDS [HARNESS...]]   run each harness (default: all) for
#                                              SECONDS (default 30), one at a time
#   tests/fuzz/run.sh --build                  build them only
#   tests/fuzz/run.sh --seeds                  rewrite the committed seed corpus
#                                              (tests/fuzz/gen_seeds.c)
#
# Every harness is tests/fuzz/fuzz_<name>.c; what it fuzzes and asserts is
# at the top of that file.  Each is built with clang -fsanitize=fuzzer,
# address,undefined (UBSan aborting) directly from the src/*.c files it
# needs, into $FUZZ_BUILD (default build-fuzz/ at the project root).  A run
# reads the committed seeds in tests/fuzz/corpus/<name>/ and puts what it
# finds in $FUZZ_BUILD/corpus/<name>/ (kept for the next run, never in the
# repository).  For each harness it prints the executions reached and
# exec/s; a crash, leak, timeout (25 s for one input), failed check or
# sanitizer report keeps the input in $FUZZ_BUILD/artifacts/<name>/ and the
# log in $FUZZ_BUILD/logs/<name>.log, and makes the script exit 1 after the
# rest have run.
#
# Environment: FUZZ_BUILD; FUZZ_RUNS=N stops each harness after N executions
# (or SECONDS, whichever comes first: FUZZ_RUNS=10000000 with a long SECONDS
# is the 10^7 goal of docs/reliability.md); CC (default clang, installed with apt-get when
# missing); SMCLO_FUZZ_SKIP_KNOWN=1 steers the harnesses clear of src/ bugs
# they found before (named at the top of each harness).
#
set -u

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/tests/fuzz"
CC=${CC:-clang}
FUZZ_BUILD=${FUZZ_BUILD:-$root/build-fuzz}

# what every harness links: the library's pure part (CMakeLists.txt: smclo_core)
core="src/proto/ring.c src/proto/clc.c src/proto/reason.c src/proto/config.c
      src/proto/log.c src/proto/addr.c src/base/elfinfo.c
      src/registry/registry.c src/registry/stats.c src/registry/peerinfo.c"

# the rest each harness needs
extra_sources() {
	case $1 in
	fuzz_ring)   echo "src/core/rx.c src/core/tx.c src/core/move.c src/core/tcpend.c src/core/bell.c src/core/io.c src/core/peerpool.c" ;;
	fuzz_region) echo "src/core/region.c src/core/conn.c src/core/shared.c src/core/peerpool.c src/core/bell.c src/core/io.c src/core/close.c src/core/rx.c src/core/tx.c src/core/move.c src/core/tcpend.c src/core/peerid.c src/base/spin.c src/base/cpus.c" ;;
	esac
}

# the core layer's include path (src/LAYERS): a harness sees what the core sees
CORE_INCLUDES=$(ROOT="$root" "$root/tools/layers.sh" includes core) || die "src/LAYERS unreadable"
CFLAGS="-g -O1 -std=gnu11 -D_GNU_SOURCE $CORE_INCLUDES -Wall -Wextra -Wno-unused-parameter
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -pthread"

die() { echo "run.sh: $*" >&2; exit 2; }

need_clang() {
	command -v "$CC" >/dev/null 2>&1 && return 0
	[ "$CC" = clang ] || die "$CC not found"
	echo "run.sh: installing clang" >&2
	local sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang >/dev/null ||
		die "could not install clang"
}

harnesses() {
	local f
	for f in "$here"/fuzz_*.c; do
		f=${f##*/}
		echo "${f%.c}"
	done
}

# Build $1 unless the binary is newer than every source it could depend on.
build() {
	local name=$1 bin="$FUZZ_BUILD/bin/$1" srcs s
	srcs="tests/fuzz/$name.c $core $(extra_sources "$name")"
	if [ -x "$bin" ] && [ -z "$(find "$root/src" "$here" -newer "$bin" \
	                               \( -name '*.c' -o -name '*.h' \) -print -quit)" ]; then
		return 0
	fi
	mkdir -p "$FUZZ_BUILD/bin"
	echo "build $name"
	(cd "$root" && $CC $CFLAGS $srcs -o "$bin.tmp") && mv "$bin.tmp" "$bin" ||
		{ echo "run.sh: building $name failed" >&2; return 1; }
}

# Run $1 for $2 seconds; print its figures; 0 if clean.
run() {
	local name=$1 secs=$2 bin="$FUZZ_BUILD/bin/$1"
	local seeds="$here/corpus/$name" scratch="$FUZZ_BUILD/corpus/$name"
	local art="$FUZZ_BUILD/artifacts/$name" log="$FUZZ_BUILD/logs/$name.log"
	local rc execs eps bad=0

	mkdir -p "$scratch" "$art" "$FUZZ_BUILD/logs" "$seeds"
	mkdir -p "$tmp/$name"
	FUZZ_TMPDIR="$tmp/$name" \
	ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
	UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
		"$bin" -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
		       -entropic_scale_per_exec_time=1 -artifact_prefix="$art/" \
		       ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} \
		       "$scratch" "$seeds" >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
	if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error:|check failed:' "$log"; then
		bad=1
	fi
	printf '%-16s %6ss %12s execs %9s exec/s  %s\n' "$name" "$secs" "${execs:-?}" \
	       "${eps:-?}" "$([ $bad = 0 ] && echo ok || echo "FAILED (exit $rc): $log")"
	if [ $bad = 1 ]; then
		grep -E 'ERROR:|runtime error:|check failed:|SUMMARY:|Test unit written' "$log" |
			head -n 5 | sed 's/^/    /'
	fi
	return $bad
}

case ${1:-} in
--seeds)
	command -v "$CC" >/dev/null 2>&1 || need_clang
	mkdir -p "$FUZZ_BUILD/bin"
	(cd "$root" && $CC -g -std=gnu11 -D_GNU_SOURCE $CORE_INCLUDES tests/fuzz/gen_seeds.c \
	      $core -pthread -o "$FUZZ_BUILD/bin/gen_seeds") || die "building gen_seeds failed"
	"$FUZZ_BUILD/bin/gen_seeds" "$here/corpus" || die "gen_seeds failed"
	echo "seeds written to tests/fuzz/corpus/"
	exit 0 ;;
--build)
	need_clang
	fail=0
	for h in $(harnesses); do build "$h" || fail=1; done
	[ $fail = 0 ] || exit 2
	exit 0 ;;
-h|--help)
	sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0 ;;
esac

secs=${1:-30}
[ -z "${FUZZ_RUNS:-}" ] || [[ "$FUZZ_RUNS" =~ ^[0-9]+$ ]] ||
	die "FUZZ_RUNS must be a number of executions: $FUZZ_RUNS"
[[ "$secs" =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || die "seconds must be a positive number: $secs"
shift $(( $# > 0 ? 1 : 0 ))
list=${*:-$(harnesses)}

need_clang
mkdir -p "$FUZZ_BUILD"
FUZZ_BUILD=$(cd "$FUZZ_BUILD" && pwd)
for h in $list; do
	[ -f "$here/$h.c" ] || die "no harness $h (tests/fuzz/$h.c)"
	build "$h" || exit 2
done

# each harness's scratch registry, on tmpfs when there is one; gone at the end
base=/dev/shm
[ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$base/smclo-fuzz.XXXXXX") || die "no temporary directory"
trap 'rm -rf "$tmp"' EXIT

fail=0
for h in $list; do
	run "$h" "$secs" || fail=1
done
exit $fail
