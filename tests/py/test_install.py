"""`make install` into a temporary DESTDIR with a PREFIX, as a packager
stages it: the command, library, man page, smclo.pc and the tmpfiles.d
entry of the shared registry land in their places; the installed `smclo run` uses the installed library (not the build
tree) and says so with -v; redis-server and redis-benchmark run through the
installed tree, accelerated; `make uninstall` removes every file again."""
import json
import os
import re
import subprocess

from conftest import BUILD, ROOT, Registry, free_port, need, wait_port

PREFIX = "/opt/smclo-test"


def project_version():
    """The one version: CMakeLists.txt's project(smclo VERSION x.y.z)."""
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(smclo VERSION ([0-9.]+)", text).group(1)


def make(*args, timeout=600):
    r = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "BUILD=" + str(BUILD)]
                       + list(args), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def files_under(d):
    return sorted(os.path.relpath(os.path.join(dp, f), d)
                  for dp, _, fs in os.walk(d) for f in fs)


def test_install_run_redis_uninstall(tmp_path, procs):
    need("redis-server")
    need("redis-benchmark")
    dest = tmp_path / "dest"
    make("install", "PREFIX=" + PREFIX, "DESTDIR=" + str(dest))
    try:
        root = dest / PREFIX.lstrip("/")
        files = files_under(root)
        libs = [f for f in files if f.endswith("/libsmclo.so")]
        assert "bin/smclo" in files and "share/man/man1/smclo.1" in files, files
        assert len(libs) == 1 and libs[0].startswith("lib"), files
        pc = [f for f in files if f.endswith("pkgconfig/smclo.pc")]
        assert len(pc) == 1, files
        pctext = (root / pc[0]).read_text()
        assert "prefix=%s\n" % PREFIX in pctext, pctext
        assert "Version: %s\n" % project_version() in pctext, pctext
        assert "preloadlib=${libdir}/libsmclo.so" in pctext, pctext
        # the shared registry as systemd-tmpfiles makes it at boot
        assert "lib/tmpfiles.d/smclo.conf" in files, files
        boot = tmp_path / "boot"
        (boot / "dev/shm").mkdir(parents=True)
        subprocess.run(["systemd-tmpfiles", "--root=%s" % boot, "--create",
                        str(root / "lib/tmpfiles.d/smclo.conf")], check=True, timeout=30)
        for sub in ("", "c", "h", "i", "l", "p", "t"):
            st = os.stat(boot / "dev/shm/smclo" / sub)
            assert st.st_uid == 0 and st.st_mode & 0o7777 == 0o1777, sub

        smclo = str(root / "bin/smclo")
        r = subprocess.run([smclo, "--version"], capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == "smclo " + project_version(), r.stdout
        man = (root / "share/man/man1/smclo.1").read_text().splitlines()[0]
        assert '"smclo %s"' % project_version() in man, man

        reg = Registry(tmp_path / "registry")
        r = subprocess.run([smclo, "run", "-v", "--", "true"], env=reg.env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        used = "preloads %s\n" % (root / libs[0])
        assert used in r.stderr, r.stderr       # the installed one, not BUILD's

        port = free_port()
        server = procs.start([smclo, "run", "--", "redis-server", "--port", str(port),
                              "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
                             reg.env, smclo=False)
        wait_port(port, proc=server)
        r = subprocess.run([smclo, "run", "--", "redis-benchmark", "-h", "127.0.0.1", "-p",
                            str(port), "-t", "set,get", "-n", "4000", "-c", "8", "-d", "256",
                            "--csv"], env=reg.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and '"SET"' in r.stdout and '"GET"' in r.stdout, r.stderr
        out = subprocess.run([smclo, "stats", "--json"], env=reg.env, capture_output=True,
                             text=True, timeout=60, check=True).stdout
        st = json.loads(out)
        assert st["fallback"] == 0, st["fallback_by_reason"]
        assert st["accelerated_client"] >= 8 and st["accelerated_server"] >= 8, st
        procs.stop(server)
    finally:
        make("uninstall", "PREFIX=" + PREFIX, "DESTDIR=" + str(dest))
    assert files_under(dest) == []
