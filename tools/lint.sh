#!/bin/sh
# lint.sh - static analysis of src/: cppcheck and gcc -fanalyzer.
#
#   tools/lint.sh            run both; exit 1 on any finding not suppressed
#   LINT_VERBOSE=1 tools/lint.sh   also list the suppressed findings
#
# Suppressions live in tools/lint-suppressions.txt (format described there);
# each one must give its reason.  Findings are matched by file, check and
# enclosing function, never by line number, so edits elsewhere in a file do
# not invalidate them.
#
# cppcheck is installed with apt-get when missing (as root, or with sudo).
set -eu

cd "$(dirname "$0")/.."
CC=${CC:-gcc}
# The project's own flags (CMakeLists.txt: C11 with GNU extensions).
# Each file is compiled with its own layer's include path (src/LAYERS, via
# tools/layers.sh), as CMake compiles it: an upward include is a finding.
CFLAGS="-std=gnu11 -D_GNU_SOURCE"
# cppcheck reads the whole program at once: every layer's headers
ALL_INCLUDES=$(for l in $(tools/layers.sh order); do tools/layers.sh includes "$l"; done |
	tr ' ' '\n' | sort -u | tr '\n' ' ')
SUPP=tools/lint-suppressions.txt
JOBS=${LINT_JOBS:-2}

if ! command -v cppcheck >/dev/null 2>&1; then
	echo "lint: installing cppcheck" >&2
	SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cppcheck >/dev/null ||
		{ $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$SUDO apt-get install -y -qq cppcheck >/dev/null; }
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/smclo-lint.XXXXXX")
trap 'rm -rf "$out"' EXIT INT TERM

files=$(find src -name '*.c' | sort)

# the one layer map: design.md's table must say what src/LAYERS says
tools/layers.sh check-doc >"$out/layers.txt" 2>&1 || {
	cat "$out/layers.txt" >&2
	echo "lint: docs/design.md's layers disagree with src/LAYERS" >&2
	exit 1
}

# cppcheck: one configuration (-D_GNU_SOURCE, as built), whole program (no
# -j, so the cross-file checks run), POSIX and GNU function knowledge.
# Exit status 2 only when cppcheck itself could not run.
echo "lint: cppcheck $(cppcheck --version | sed 's/^Cppcheck //')" >&2
cppcheck --enable=warning,style,performance,portability --inconclusive \
	--std=c11 -D_GNU_SOURCE $ALL_INCLUDES --library=posix --library=gnu \
	--inline-suppr --quiet \
	--template='cppcheck|{file}|{line}|{id}|{severity}: {message}' \
	$files 2>"$out/cppcheck.txt" >/dev/null || {
	cat "$out/cppcheck.txt" >&2
	echo "lint: cppcheck failed to run" >&2
	exit 2
}

# gcc -fanalyzer, one file per compiler run.  A file that does not compile
# is reported as a finding too.
echo "lint: $($CC --version | head -1) -fanalyzer" >&2
export CC CFLAGS out
printf '%s\n' $files | xargs -P "$JOBS" -I{} sh -c \
	'f={}; o="$out/an.$(echo "$f" | tr / _)";
	 inc=$(tools/layers.sh includes "$(tools/layers.sh layer "$f")") || inc=;
	 $CC $CFLAGS $inc -fanalyzer -fdiagnostics-plain-output -fno-diagnostics-color \
	     -Wno-unused-parameter -c -o /dev/null "$f" >"$o" 2>&1 ||
	     echo "$f:1:1: error: does not compile [compile-error]" >>"$o"'
cat "$out"/an.* >"$out/analyzer.txt" 2>/dev/null || : >"$out/analyzer.txt"

python3 - "$SUPP" "$out/cppcheck.txt" "$out/analyzer.txt" <<'EOF'
import fnmatch, os, re, sys

supp_path, cpp_path, an_path = sys.argv[1:4]
verbose = os.environ.get("LINT_VERBOSE") == "1"

def enclosing_function(path, line):
    """Name of the function whose body holds @line: the project's style puts
    a definition's name at column 0 and its '{' alone on the next line(s)."""
    try:
        src = open(path, errors="replace").read().splitlines()
    except OSError:
        return "?"
    i = min(line, len(src)) - 1
    head = re.compile(r"[A-Za-z_].*?\b([A-Za-z_]\w*)\s*\(")
    m = head.match(src[i]) if i >= 0 else None
    if m:               # on a definition's own first line (parameters)
        for j in range(i + 1, min(i + 8, len(src))):
            if src[j] == "{":
                return m.group(1)
            if src[j].rstrip().endswith(";") or not src[j].startswith((" ", "\t")):
                break
    while i >= 0 and src[i] != "{":
        if src[i] == "}" and i != line - 1:
            return "<file scope>"
        i -= 1
    while i > 0:
        i -= 1
        m = head.match(src[i])
        if m:
            return m.group(1)
    return "<file scope>"

findings = []   # (tool, file, line, check, function, text)

for l in open(cpp_path, errors="replace"):
    f = l.rstrip("\n").split("|", 4)
    if len(f) != 5 or f[0] != "cppcheck":
        if l.strip():
            findings.append(("cppcheck", "?", 0, "cppcheck-output", "?", l.strip()))
        continue
    _, path, line, check, text = f
    line = int(line) if line.isdigit() else 0
    findings.append(("cppcheck", os.path.normpath(path), line, check,
                     enclosing_function(path, line), text))

func = "<file scope>"
for l in open(an_path, errors="replace"):
    l = l.rstrip("\n")
    m = re.match(r"(\S+): In function [‘'](\w+)[’']", l)
    if m:
        func = m.group(2)
        continue
    m = re.match(r"(\S+?):(\d+):\d+: (warning|error): (.*?)(?: \[CWE-\d+\])? \[(-W[\w-]+|[\w-]+)\]$", l)
    if not m:
        m2 = re.match(r"(\S+?):(\d+):\d+: (warning|error): (.*)$", l)
        if m2:      # a diagnostic without an option name: still a finding
            findings.append(("analyzer", os.path.normpath(m2.group(1)), int(m2.group(2)),
                             m2.group(3), func, m2.group(4)))
        continue
    path, line, sev, text, check = m.groups()
    check = check[2:] if check.startswith("-W") else check
    findings.append(("analyzer", os.path.normpath(path), int(line), check,
                     func if check != "compile-error" else "*", sev + ": " + text))

# Suppressions: "TOOL FILE CHECK FUNCTION", fnmatch patterns; the reason is a
# comment on the same line or on the line(s) just above.
supps, bad = [], []
reason = None
for n, raw in enumerate(open(supp_path), 1):
    s = raw.strip()
    if not s:
        reason = None
        continue
    if s.startswith("#"):
        reason = s.lstrip("# ").strip() or reason
        continue
    body, _, why = s.partition("#")
    f = body.split()
    if len(f) != 4 or f[0] not in ("cppcheck", "analyzer", "*"):
        bad.append("%s:%d: want TOOL FILE CHECK FUNCTION: %s" % (supp_path, n, s))
        continue
    why = why.strip() or reason
    if not why:
        bad.append("%s:%d: suppression without a reason: %s" % (supp_path, n, s))
        continue
    supps.append({"pat": f, "where": "%s:%d" % (supp_path, n), "used": 0})

shown = suppressed = 0
for tool, path, line, check, fn, text in sorted(findings, key=lambda x: (x[1], x[2], x[0])):
    hit = None
    for sp in supps:
        t, fp, cp, fnp = sp["pat"]
        if (fnmatch.fnmatchcase(tool, t) and fnmatch.fnmatchcase(path, fp) and
                fnmatch.fnmatchcase(check, cp) and fnmatch.fnmatchcase(fn, fnp)):
            hit = sp
            break
    if hit:
        hit["used"] += 1
        suppressed += 1
        if verbose:
            print("suppressed (%s): %s:%d: [%s %s] %s: %s" %
                  (hit["where"], path, line, tool, check, fn, text))
        continue
    shown += 1
    print("%s:%d: [%s %s] in %s(): %s" % (path, line, tool, check, fn, text))

for sp in supps:
    if not sp["used"]:
        print("lint: note: %s matches nothing now (stale?): %s" %
              (sp["where"], " ".join(sp["pat"])), file=sys.stderr)
for b in bad:
    print("lint: " + b, file=sys.stderr)
print("lint: %d finding(s), %d suppressed" % (shown, suppressed), file=sys.stderr)
sys.exit(1 if shown or bad else 0)
EOF
