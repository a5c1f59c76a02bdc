#!/bin/sh
# sanitize.sh - the tests against sanitizer builds of smclo.
#
#   tools/sanitize.sh [PYTEST ARGS...]
#       AddressSanitizer + UndefinedBehaviorSanitizer: configures and builds
#       build-asan/ (-DSMCLO_SANITIZE=address,undefined), checks that a report
#       from a preloaded library reaches the log directory (canary), runs the
#       unit tests, then the pytest suite with SMCLO_BUILD=build-asan.
#   tools/sanitize.sh --tsan [PYTEST ARGS...]
#       ThreadSanitizer: build-tsan/ (-DSMCLO_SANITIZE=thread) and the stream
#       stress test (tests/progs/stress.c, itself built with TSan, so the
#       runtime comes with the program) against the TSan library.
#
# Every sanitizer report is written to <build>/sanitizer-logs/ (log_path),
# not to the programs' stderr, which tests read.  The run fails (exit 1) if
# any report exists, or if the tests fail.
#
# How the runtime gets into foreign programs (python, redis, nginx...): the
# library is preloaded, and libasan must be loaded ahead of it and of libc.
# `smclo run` puts SMCLO_PRELOAD_FIRST=libasan.so:libubsan.so ahead of the
# library, so every program the tests start under smclo gets the runtimes
# first; the smclo command and the test programs (stress...) are built with
# the sanitizers and bring their own.  UBSan's log file needs a helper
# (tools/sanitize/ubsan_log_path.c), preloaded through the inherited
# LD_PRELOAD.  The canary step proves that a heap overflow and a signed
# overflow in a preloaded library both reach the log directory.
#
# Tests that cannot run with libasan preloaded (curl and postgres hang in
# glibc, with or without smclo) are listed, with the reason, in
# tools/sanitize/asan-deselect.txt and left out.
#
# Environment: SANITIZE_BUILD (default build-asan or build-tsan), PYTHON,
# CMAKE_BUILD_TYPE (default RelWithDebInfo).
set -eu

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
MODE=asan
if [ "${1:-}" = "--tsan" ]; then
	MODE=tsan
	shift
fi
BUILD=${SANITIZE_BUILD:-build-$MODE}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOGS=$BUILD/sanitizer-logs

if [ $MODE = asan ]; then SAN=address,undefined; else SAN=thread; fi
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja" || GEN=
if [ -f "$BUILD/CMakeCache.txt" ]; then GEN=; fi        # keep its generator
echo "sanitize: configuring $BUILD (-DSMCLO_SANITIZE=$SAN)" >&2
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
	-DSMCLO_SANITIZE=$SAN >/dev/null
cmake --build "$BUILD"

# The runtimes of the very compiler CMake used.
CC_USED=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
runtime() {
	p=$("${CC_USED:-cc}" -print-file-name="$1")
	[ -e "$p" ] || { echo "sanitize: $1 not found (install the compiler's sanitizer runtimes)" >&2; exit 2; }
	echo "$p"
}

rm -rf "$LOGS"
mkdir -p "$LOGS"
chmod 1777 "$LOGS"      # servers that drop root (nginx workers, postgres) report too

# Reports in @dir: list the files and each distinct report once (a count
# first), return 1 if there is any.
check_logs() {
	set -- "$1" "$1"/*
	[ -e "$2" ] || return 0
	dir=$1
	shift
	ls -1 "$@"
	grep -hE 'SUMMARY: |runtime error:' "$@" | sed 's/^==[0-9]*==//' | sort | uniq -c | sort -rn
	echo "sanitize: $# report file(s) in $dir" >&2
	return 1
}

# no core files: a sanitized process maps terabytes of shadow memory
ulimit -c 0

status=0
if [ $MODE = asan ]; then
	ASAN_RT=$(runtime libasan.so)
	UBSAN_RT=$(runtime libubsan.so)
	# detect_leaks=0: the foreign programs (python, redis...) leak at exit by
	# design; halt_on_error: the first report ends the process, as UBSan's do
	# (-fno-sanitize-recover); log_exe_name: file names say which program;
	# verify_asan_link_order=0: a test that sets LD_PRELOAD=libsmclo.so itself
	# gets the runtime behind libc (only stack and global checks then), and
	# must not die of it.
	ASAN_OPTS="detect_leaks=0:verify_asan_link_order=0:halt_on_error=1:log_exe_name=1:strip_path_prefix=$ROOT/"
	UBSAN_OPTS="print_stacktrace=1:halt_on_error=1:log_exe_name=1:strip_path_prefix=$ROOT/"

	helper=$BUILD/sanitize-helpers
	mkdir -p "$helper"
	"$CC_USED" -shared -fPIC -O1 -o "$helper/libubsan_log_path.so" \
		tools/sanitize/ubsan_log_path.c -ldl
	"$CC_USED" -shared -fPIC -g -fsanitize=address,undefined -fno-sanitize-recover=all \
		-o "$helper/libcanary.so" tools/sanitize/canary.c
	UBLOG=$helper/libubsan_log_path.so

	# Where the runtimes go.  `smclo run` puts SMCLO_PRELOAD_FIRST ahead of the
	# library: the runtimes come first, as ASan wants, and only the programs
	# that load smclo carry them (python, pytest, setpriv... stay plain).  A
	# tree whose `smclo run` does not know SMCLO_PRELOAD_FIRST gets them
	# through the inherited LD_PRELOAD instead, behind the library
	# (verify_asan_link_order=0 lets that run: still ahead of libc, so
	# malloc and the interceptors are ASan's).  The UBSan log helper goes
	# last either way: preloaded objects are initialised last first.
	probe=$(env -u LD_PRELOAD SMCLO_PRELOAD_FIRST="$ASAN_RT:$UBSAN_RT" ASAN_OPTIONS="$ASAN_OPTS" \
		SMCLO_DIR="$helper/registry" "$BUILD/smclo" run -- printenv LD_PRELOAD 2>/dev/null || :)
	case $probe in
	"$ASAN_RT:$UBSAN_RT:"*)
		export SMCLO_PRELOAD_FIRST="$ASAN_RT:$UBSAN_RT"
		INHERIT=$UBLOG
		echo "sanitize: runtimes first through SMCLO_PRELOAD_FIRST" >&2 ;;
	*)
		INHERIT=$ASAN_RT:$UBSAN_RT:$UBLOG
		echo "sanitize: this smclo run has no SMCLO_PRELOAD_FIRST: runtimes behind the library" >&2 ;;
	esac

	# The canary: a library with a planted heap overflow and a planted signed
	# overflow, preloaded as the suite preloads everything; each must leave
	# its report in the log directory.
	for what in "asan heap-buffer-overflow" "ubsan signed integer overflow"; do
		expect=${what#* }
		what=${what%% *}
		rm -rf "$helper/logs"
		mkdir -p "$helper/logs"
		env LD_PRELOAD="$helper/libcanary.so:$INHERIT" SANITIZE_CANARY=$what \
			SMCLO_DIR="$helper/registry" \
			ASAN_OPTIONS="$ASAN_OPTS:log_path=$helper/logs/asan" \
			UBSAN_OPTIONS="$UBSAN_OPTS" SANITIZE_UBSAN_LOG_PATH="$helper/logs/ubsan" \
			"$BUILD/smclo" run -- true >/dev/null 2>&1 || :
		if ! grep -qs "$expect" "$helper/logs"/*; then
			echo "sanitize: the $what canary left no report in $helper/logs: reports would be lost" >&2
			exit 2
		fi
	done
	echo "sanitize: canaries reported (ASan, UBSan through smclo run)" >&2

	export ASAN_OPTIONS="$ASAN_OPTS:log_path=$LOGS/asan"
	export UBSAN_OPTIONS="$UBSAN_OPTS"        # log_path: see ubsan_log_path.c
	export SANITIZE_UBSAN_LOG_PATH="$LOGS/ubsan"

	echo "sanitize: unit tests" >&2
	(cd "$BUILD" && ctest --output-on-failure) || status=1

	# tests that cannot run under a preloaded ASan: tools/sanitize/asan-deselect.txt
	deselect=$(sed -n 's/^\([^#[:space:]][^[:space:]]*\).*/--deselect=\1/p' \
		tools/sanitize/asan-deselect.txt)
	echo "sanitize: pytest suite against $BUILD" >&2
	# A handshake waits up to 1 s instead of 300 ms: fork() of an
	# ASan-instrumented process copies its shadow mappings (tens of ms), so
	# a server forking a handler per connection (exec-python in
	# test_kill_pattern, socat fork) answers the next offers late, and a
	# client that gives up counts a timeout where the plain build does not.
	# Tests that need a short or long timeout set their own.  The
	# differential suite runs its inbox path only (SMCLO_DIFF_PATHS): every
	# path runs the same rings, and the oracle's runs load no smclo.
	# shellcheck disable=SC2086
	(cd tests/py && env LD_PRELOAD="$INHERIT" SMCLO_BUILD="$BUILD" SMCLO_HANDSHAKE_MS=1000 \
		SMCLO_DIFF_PATHS=inbox \
		"$PYTHON" -m pytest -q -p no:cacheprovider $deselect "$@") || status=1
else
	# halt_on_error=0, exitcode=0: collect every race of a run, and let the
	# test judge the program's own result; the logs judge the races.
	# disable_coredump=0: TSan would call setrlimit(RLIMIT_CORE) while it
	# initialises, which reaches the library's instrumented setrlimit
	# wrapper before TSan can run it (SIGSEGV at start); the ulimit -c 0
	# above does the same job from outside.
	export TSAN_OPTIONS="disable_coredump=0:halt_on_error=0:exitcode=0:second_deadlock_stack=1:log_path=$LOGS/tsan:suppressions=$ROOT/tools/sanitize/tsan-suppressions.txt:strip_path_prefix=$ROOT/"
	echo "sanitize: stress test against $BUILD (TSan)" >&2
	(cd tests/py && env SMCLO_BUILD="$BUILD" \
		"$PYTHON" -m pytest -q -p no:cacheprovider test_stress.py "$@") || status=1
fi

check_logs "$LOGS" || status=1
[ $status = 0 ] && echo "sanitize: clean ($MODE)" >&2
exit $status
