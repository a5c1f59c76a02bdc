"""`make deb` builds smclo_<version>_<arch>.deb (lintian passes, or
`make deb` fails); its Depends names the package of every library the
binaries need; installed with `apt-get install ./smclo_...deb` (this is
the CI machine: the package is removed again whatever happens, and a
machine where smclo is installed already is left alone), /usr/bin/smclo
runs a client/server pair accelerated; `apt-get remove --purge` leaves no
file of the package behind."""
import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, Registry, free_port, need, wait_port

from test_install import project_version

APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                       text=True, timeout=60)
    return r.returncode == 0 and "installed" in r.stdout.split()


def apt(*args, cwd=None):
    """apt-get, waiting for the dpkg lock if another apt run holds it."""
    return subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=120"] + list(args), cwd=cwd,
                          env=APT_ENV, capture_output=True, text=True, timeout=600)


def needed_packages(deb, tmp_path):
    """The packages owning the shared libraries the package's ELF files need."""
    x = tmp_path / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(x)], check=True, timeout=60)
    pkgs = set()
    for f in ["usr/bin/smclo"] + [str(p.relative_to(x)) for p in x.glob("usr/lib/*/libsmclo.so")]:
        out = subprocess.run(["ldd", str(x / f)], capture_output=True, text=True,
                             timeout=60).stdout
        for m in re.finditer(r"=> (/\S+)", out):
            # dpkg knows a file by the path its package ships (/lib or /usr/lib)
            for path in (m.group(1), os.path.realpath(m.group(1))):
                owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True,
                                       timeout=60).stdout
                if owner:
                    break
            assert owner, "no package owns %s" % m.group(1)
            pkgs.add(owner.split(":")[0])
    return pkgs


def test_deb_install_run_purge(tmp_path, procs):
    need("dpkg-deb")
    need("lintian")
    need("redis-server")
    if installed("smclo"):
        pytest.skip("smclo is installed on this machine already: not replacing it")
    version = project_version()
    r = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "deb",
                        "DEB_DIR=" + str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr       # lintian's complaints fail it too
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    deb = tmp_path / ("smclo_%s_%s.deb" % (version, arch))
    assert deb.exists(), os.listdir(tmp_path)

    info = subprocess.run(["dpkg-deb", "-f", str(deb), "Version", "Depends"],
                          capture_output=True, text=True, check=True).stdout
    assert "Version: %s\n" % version in info, info
    depends = re.search(r"Depends: (.*)", info).group(1)
    for pkg in needed_packages(deb, tmp_path):
        assert re.search(r"(^|, )%s( |,|$)" % re.escape(pkg), depends), (pkg, depends)
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    paths = [l.split()[5].lstrip(".") for l in listing.splitlines()]
    files = [p for p in paths if not p.endswith("/")]
    for want in ("/usr/bin/smclo", "/usr/share/man/man1/smclo.1.gz",
                 "/usr/share/doc/smclo/copyright", "/usr/share/doc/smclo/changelog.gz"):
        assert want in files, files
    assert any(re.fullmatch(r"/usr/lib/[^/]+/libsmclo\.so", f) for f in files), files

    try:
        r = apt("install", "-y", "./" + deb.name, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert installed("smclo")
        r = subprocess.run(["/usr/bin/smclo", "--version"], capture_output=True, text=True,
                           timeout=30)
        assert r.stdout.strip() == "smclo " + version

        reg = Registry(tmp_path / "registry")
        r = subprocess.run(["/usr/bin/smclo", "run", "-v", "--", "true"], env=reg.env,
                           capture_output=True, text=True, timeout=30)
        assert re.search(r"preloads /usr/lib/[^/]+/libsmclo\.so\n", r.stderr), r.stderr

        port = free_port()
        server = procs.start(["/usr/bin/smclo", "run", "--", "redis-server", "--port",
                              str(port), "--save", "", "--appendonly", "no",
                              "--bind", "127.0.0.1"], reg.env, smclo=False)
        wait_port(port, proc=server)
        r = subprocess.run(["/usr/bin/smclo", "run", "--", "redis-benchmark", "-h", "127.0.0.1",
                            "-p", str(port), "-t", "set,get", "-n", "2000", "-c", "4", "-q"],
                           env=reg.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        st = json.loads(subprocess.run(["/usr/bin/smclo", "stats", "--json"], env=reg.env,
                                       capture_output=True, text=True, timeout=60,
                                       check=True).stdout)
        assert st["fallback"] == 0, st["fallback_by_reason"]
        assert st["accelerated_client"] >= 4 and st["accelerated_server"] >= 4, st
        procs.stop(server)
    finally:
        if installed("smclo"):
            r = apt("remove", "--purge", "-y", "smclo")
            assert r.returncode == 0, r.stdout + r.stderr
    assert not installed("smclo")
    left = [f for f in files if os.path.lexists(f)]
    assert left == [], left
