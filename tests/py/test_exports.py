"""What libsmclo.so exports: exactly the libc functions it interposes (and
smclo_* once the native API exists), through src/runtime/libsmclo.map.

A wrapper marked EXPORT in src/ but missing from the map would be made
local by the linker, and the program would call libc's function instead,
silently unaccelerated (or worse: half of a connection's calls through smclo,
half not).  Anything exported beyond those would let programs bind to
smclo's internals.  Both definitions must stay unversioned: a versioned one
would not satisfy a program's reference to connect@GLIBC_2.2.5.
"""
import re
import subprocess
from pathlib import Path

from conftest import SMCLO

ROOT = Path(__file__).resolve().parents[2]
LIB = Path(SMCLO).parent / "libsmclo.so"


def exported():
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(LIB)], check=True,
                         capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        w = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(w) >= 8 and w[4] == "GLOBAL" and w[6] != "UND":
            syms[w[7]] = w[3]
    return syms


def marked_export():
    """Every function defined with EXPORT in src/ (declarations may wrap)."""
    names = set()
    for f in (ROOT / "src").rglob("*.c"):
        text = f.read_text()
        for m in re.finditer(r"\bEXPORT\b([^;{]*?)\b(\w+)\s*\(", text):
            names.add(m.group(2))
    return names


def in_map():
    text = re.sub(r"/\*.*?\*/", "", (ROOT / "src" / "runtime" / "libsmclo.map").read_text(), flags=re.S)
    glob = text.split("global:")[1].split("local:")[0]
    return {n.strip() for n in glob.split(";") if n.strip()}


def test_exports_are_exactly_the_wrappers():
    syms = exported()
    marked = marked_export()
    assert marked, "no EXPORT found in src/"
    missing = marked - set(syms)
    assert not missing, "marked EXPORT but not exported (add them to src/runtime/libsmclo.map): %s" % \
        sorted(missing)
    allowed = in_map()
    extra = {s for s in syms if s not in allowed and not s.startswith("smclo_")}
    assert not extra, "exported beyond src/runtime/libsmclo.map: %s" % sorted(extra)
    unmarked = {s for s in syms if s not in marked and not s.startswith("smclo_")}
    assert not unmarked, "exported but not an EXPORT wrapper: %s" % sorted(unmarked)


def test_exports_are_unversioned():
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(LIB)], check=True,
                         capture_output=True, text=True).stdout
    versioned = [l.split()[-1] for l in out.splitlines()
                 if " GLOBAL " in l and " UND " not in l and "@" in l.split()[-1]]
    assert not versioned, versioned
