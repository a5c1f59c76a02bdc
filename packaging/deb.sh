#!/bin/sh
# deb.sh - builds the Debian package smclo_<version>_<arch>.deb (make deb).
#
#   packaging/deb.sh [BUILD_DIR [OUT_DIR]]    defaults: build-deb and .
#
# A plain dpkg-deb build, no debian/ source tree: configure a build with
# prefix /usr (the library goes to /usr/lib/<multiarch>) and Debian's
# hardening flags (dpkg-buildflags), install it into a staging tree, strip
# as dh_strip does, compress the manual page, add copyright (from LICENSE),
# changelog and lintian overrides, compute Depends with dpkg-shlibdeps, and
# pack it owned by root (dpkg-deb --root-owner-group: no fakeroot needed).
# The version is the one of CMakeLists.txt's project(), read back from the
# header CMake generated; lintian runs on the result if it is installed.
set -eu

cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build-deb}
OUT=${2:-.}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for tool in dpkg-deb dpkg-shlibdeps dpkg-buildflags; do
	command -v $tool >/dev/null 2>&1 ||
		{ echo "deb: $tool is missing (apt-get install dpkg-dev)" >&2; exit 2; }
done

# Debian's own compiler and linker flags, all hardening features on.
eval "$(DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --export=sh)"
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja" || GEN=
[ -f "$BUILD/CMakeCache.txt" ] && GEN=
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
	-DCMAKE_C_FLAGS="$CFLAGS $CPPFLAGS" -DCMAKE_EXE_LINKER_FLAGS="$LDFLAGS" \
	-DCMAKE_SHARED_LINKER_FLAGS="$LDFLAGS" >/dev/null
cmake --build "$BUILD" --target smclo smclo_cli smclo_man

VERSION=$(sed -n 's/^#define SMCLO_VERSION "\(.*\)"$/\1/p' "$BUILD/generated/smclo_version.h")
ARCH=$(dpkg --print-architecture)
[ -n "$VERSION" ] || { echo "deb: no version in $BUILD/generated/smclo_version.h" >&2; exit 2; }
DEB=$OUT/smclo_${VERSION}_${ARCH}.deb

STAGE=$BUILD/deb-root
rm -rf "$STAGE"
umask 022
DESTDIR=$STAGE cmake --install "$BUILD" --prefix /usr >/dev/null
DOC=$STAGE/usr/share/doc/smclo
mkdir -p "$DOC" "$STAGE/DEBIAN" "$STAGE/usr/share/lintian/overrides"

# Strip as dh_strip does (the symbols a debugger wants would go to a
# -dbgsym package, which this plain build does not make).
find "$STAGE/usr/bin" -type f -exec strip --remove-section=.comment --remove-section=.note {} +
find "$STAGE/usr/lib" -name '*.so' -type f -exec strip --remove-section=.comment \
	--remove-section=.note --strip-unneeded {} +
chmod 0644 "$STAGE"/usr/lib/*/libsmclo.so
gzip -9n "$STAGE/usr/share/man/man1/smclo.1"
# the API's pages: a page that only names another (.so) becomes a link to
# it, as dh_installman makes them
for page in "$STAGE"/usr/share/man/man3/*.3; do
	target=$(sed -n 's|^\.so man3/\(.*\)$|\1|p' "$page")
	if [ -n "$target" ]; then
		rm "$page"
		ln -s "$target.gz" "$page.gz"
	else
		gzip -9n "$page"
	fi
done

# copyright: the machine-readable header, then the licence text of LICENSE
# (from its permission notice on) as the Expat licence's body.
{
	cat packaging/deb/copyright.in
	sed -n '/^Permission is hereby granted/,$p' LICENSE | sed 's/^$/./; s/^/ /'
} >"$DOC/copyright"

# changelog: one entry for this version, dated by the commit it is built
# from (reproducible), or now outside a git checkout.
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DATE=$(git log -1 --format=%cD 2>/dev/null || date -R)
sed -e "s/@VERSION@/$VERSION/g" -e "s/@COMMIT@/$COMMIT/g" -e "s/@DATE@/$DATE/g" \
	packaging/deb/changelog.in | gzip -9n >"$DOC/changelog.gz"
cp packaging/deb/lintian-overrides "$STAGE/usr/share/lintian/overrides/smclo"

# Depends: what the binaries need, as dpkg-shlibdeps finds it (it wants a
# debian/control to read; a minimal one in a scratch directory will do).
WORK=$BUILD/deb-shlibdeps
rm -rf "$WORK"
mkdir -p "$WORK/debian"
printf 'Source: smclo\n\nPackage: smclo\nArchitecture: any\n' >"$WORK/debian/control"
DEPENDS=$(cd "$WORK" && dpkg-shlibdeps -O -e"$STAGE/usr/bin/smclo" \
	-e"$(echo "$STAGE"/usr/lib/*/libsmclo.so)" | sed -n 's/^shlibs:Depends=//p')
[ -n "$DEPENDS" ] || { echo "deb: dpkg-shlibdeps found no dependencies" >&2; exit 2; }

SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$SIZE/" \
	-e "s/@DEPENDS@/$DEPENDS/" packaging/deb/control.in >"$STAGE/DEBIAN/control"
(cd "$STAGE" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$STAGE/DEBIAN/md5sums"
# the library is in a directory of the loader's cache: refresh the cache
# (LD_PRELOAD=libsmclo.so by name needs it)
echo "activate-noawait ldconfig" >"$STAGE/DEBIAN/triggers"
chmod 0644 "$STAGE/DEBIAN/control" "$STAGE/DEBIAN/md5sums" "$STAGE/DEBIAN/triggers"
# the shared registry made at once, not only at the next boot (tmpfiles.d)
install -m 0755 packaging/deb/postinst "$STAGE/DEBIAN/postinst"

dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$DEB" >/dev/null
echo "deb: $DEB ($(du -k "$DEB" | cut -f1) KiB; Depends: $DEPENDS)"
if command -v lintian >/dev/null 2>&1; then
	echo "deb: lintian $DEB" >&2
	lintian --info --display-info --pedantic --fail-on error,warning "$DEB" ||
		{ echo "deb: lintian found problems" >&2; exit 1; }
fi
