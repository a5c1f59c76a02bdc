#!/bin/sh
# layers.sh - the layer map of src/LAYERS, for the scripts that compile
# files outside CMake (tools/lint.sh, tests/fuzz/run.sh).  CMakeLists.txt
# reads the same file.
#
#   tools/layers.sh order            the layers, lowest first
#   tools/layers.sh includes LAYER   -I flags for a file of LAYER: its own
#                                    directory and private/, its extra
#                                    directories, every layer it reaches
#   tools/layers.sh layer FILE       the layer of src/LAYER/... FILE
#   tools/layers.sh check-doc        docs/design.md's table of layers says
#                                    what src/LAYERS says (tools/lint.sh)
#
# Paths are relative to the project's root unless ROOT is set.
set -eu
root=${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
map="$root/src/LAYERS"

case ${1:-} in
order)
	awk '!/^#/ && NF { print $1 }' "$map" ;;
includes)
	[ $# -eq 2 ] || { echo "usage: layers.sh includes LAYER" >&2; exit 2; }
	awk -v want="$2" -v root="${ROOT:-}" '
		!/^#/ && NF { deps[$1] = ""; for (i = 2; i <= NF; i++) deps[$1] = deps[$1] " " $i; known[$1] = 1 }
		function reach(l,   n, d, i) {
			if (seen[l]++) return
			out = out " -I" root (root ? "/" : "") "src/" l
			n = split(deps[l], d, " ")
			for (i = 1; i <= n; i++) if (substr(d[i], 1, 1) != "/") reach(d[i])
		}
		END {
			if (!known[want]) { print "layers.sh: no layer " want " in src/LAYERS" > "/dev/stderr"; exit 2 }
			pre = root (root ? "/" : "")
			out = " -I" pre "src/" want "/private"
			n = split(deps[want], d, " ")
			for (i = 1; i <= n; i++) if (substr(d[i], 1, 1) == "/") out = out " -I" pre substr(d[i], 2)
			reach(want)
			print substr(out, 2)
		}' "$map" ;;
layer)
	[ $# -eq 2 ] || { echo "usage: layers.sh layer FILE" >&2; exit 2; }
	l=$(printf '%s\n' "$2" | sed -n 's|^\(.*/\)\{0,1\}src/\([^/]*\)/.*|\2|p')
	awk -v l="$l" '!/^#/ && $1 == l { found = 1 } END { exit !found }' "$map" ||
		{ echo "layers.sh: $2 is in no layer of src/LAYERS" >&2; exit 2; }
	echo "$l" ;;
check-doc)
	# the table's rows: | layer | `src/dir/` | what it holds | calls directly |
	awk -F'|' '
		FILENAME == ARGV[1] { if (/^#/ || !(n = split($0, f, " "))) next
		                      calls = ""; for (i = 2; i <= n; i++) if (substr(f[i], 1, 1) != "/") calls = calls " " f[i]
		                      want[f[1]] = calls; next }
		FILENAME != ARGV[1] && $3 ~ /`src\/[a-z]+\/`/ {
			l = $2; gsub(/ /, "", l); c = $5; sub(/\(.*/, "", c); gsub(/,/, " ", c)
			if (c ~ /libc only/) c = ""
			n = split(c, w, " "); got = ""; for (i = 1; i <= n; i++) got = got " " w[i]
			seen[l] = 1
			if (!(l in want) || want[l] != got) { print "docs/design.md: layer " l " calls" got ", src/LAYERS says" want[l]; bad = 1 }
		}
		END { for (l in want) if (!seen[l]) { print "docs/design.md: no row for layer " l; bad = 1 }; exit bad }
	' "$map" "$root/docs/design.md" ;;
*)
	echo "usage: layers.sh order | includes LAYER | layer FILE | check-doc" >&2; exit 2 ;;
esac
