"""`smclo run` looks at the program first and says, in one line on stderr,
when the preload library cannot work in it (src/cli/inspect.c): a static
executable, a Go program (with and without cgo), a set-user-ID,
set-group-ID or file-capabilities program the loader runs in secure mode,
and launchers that drop LD_PRELOAD (env -i, env -u, sudo), followed through
`#!` lines.  Every such program still runs, on plain TCP; a normal dynamic
program gets no warning; a program that does not exist is named."""
import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import PY, SMCLO, free_port, go_build, need, wait_port

WARN = "smclo: warning: "
NOT_REACHED = "it runs on plain TCP, not accelerated"

# connects to 127.0.0.1:argv[1] when that is a port (a #! line passes the
# script's path instead), exchanges a line, then prints hello
C_PROG = r"""
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv)
{
	if (argc > 1 && strspn(argv[1], "0123456789") == strlen(argv[1])) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])) };
		int s = socket(AF_INET, SOCK_STREAM, 0);
		char buf[5];
		inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
		if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0 || write(s, "ping\n", 5) != 5 ||
		    read(s, buf, 5) != 5)
			return 1;
	}
	puts("hello");
	return 0;
}
"""

GO_PROG = """package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) > 1 {
		if _, err := strconv.Atoi(os.Args[1]); err != nil {
			fmt.Println("hello")
			return
		}
		c, err := net.Dial("tcp", "127.0.0.1:"+os.Args[1])
		if err != nil {
			os.Exit(1)
		}
		buf := make([]byte, 5)
		c.Write([]byte("ping\\n"))
		if _, err := c.Read(buf); err != nil {
			os.Exit(1)
		}
	}
	fmt.Println("hello")
}
"""


@pytest.fixture(scope="module")
def progs():
    """Test programs in a directory every user can reach (setpriv runs some
    as nobody): dyn, static, gocgo (Go with cgo: dynamically linked), and
    set-ID / capability copies of dyn."""
    d = tempfile.mkdtemp(prefix="smclo-inspect-", dir="/tmp")
    os.chmod(d, 0o755)
    try:
        src = os.path.join(d, "hello.c")
        with open(src, "w") as f:
            f.write(C_PROG)
        for name, extra in (("dyn", []), ("static", ["-static"])):
            subprocess.run(["gcc", "-O1", "-o", os.path.join(d, name), src] + extra,
                           check=True, timeout=120)
        # cgo on: the case that has a dynamic loader and still bypasses it
        go_build(d, "gocgo", GO_PROG)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run(args, env, prefix=(), **kw):
    kw.setdefault("timeout", 60)
    return subprocess.run(list(prefix) + [SMCLO, "run", "--"] + list(args), env=env,
                          capture_output=True, text=True, **kw)


def warnings(r):
    return [l for l in r.stderr.splitlines() if l.startswith(WARN)]


def assert_one_warning(r, *words):
    w = warnings(r)
    assert len(w) == 1, r.stderr
    assert NOT_REACHED in w[0], w[0]
    for word in words:
        assert word in w[0], w[0]
    assert r.returncode == 0 and r.stdout.strip() == "hello", (r.returncode, r.stdout, r.stderr)
    return w[0]


def start_echo(reg, procs):
    port = free_port()
    p = procs.start([PY, os.path.join(os.path.dirname(__file__), "peer.py"), "echo",
                     "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=p)
    return port


def test_dynamic_program_no_warning(reg, progs):
    r = run([os.path.join(progs, "dyn")], reg.env)
    assert r.returncode == 0 and r.stdout.strip() == "hello", r.stderr
    assert warnings(r) == [], r.stderr
    # a launcher that keeps the environment, and a shell script, are followed silently
    script = os.path.join(progs, "plain.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\nexec %s\n" % os.path.join(progs, "dyn"))
    os.chmod(script, 0o755)
    for args in (["env", "A=1", os.path.join(progs, "dyn")], [script]):
        r = run(args, reg.env)
        assert r.returncode == 0 and r.stdout.strip() == "hello", r.stderr
        assert warnings(r) == [], (args, r.stderr)


def test_static_program_warned_and_runs_on_tcp(reg, procs, progs):
    port = start_echo(reg, procs)
    w = assert_one_warning(run([os.path.join(progs, "static"), str(port)], reg.env),
                           "statically linked")
    assert os.path.join(progs, "static") in w
    st = reg.wait_stats(lambda s: s["fallback_by_reason"].get("peer-no-smclo", 0) >= 1)
    assert st["fallback_by_reason"].get("peer-no-smclo", 0) >= 1, st


def test_go_program_warned_and_runs_on_tcp(reg, procs, progs):
    go = os.path.join(progs, "gocgo")
    interp = subprocess.run(["readelf", "-l", go], capture_output=True, text=True).stdout
    assert "Requesting program interpreter" in interp, "cgo build should be dynamic"
    port = start_echo(reg, procs)
    assert_one_warning(run([go, str(port)], reg.env), "a Go program", "raw system calls")
    st = reg.wait_stats(lambda s: s["fallback_by_reason"].get("peer-no-smclo", 0) >= 1)
    assert st["fallback_by_reason"].get("peer-no-smclo", 0) >= 1, st


def nosuid(path):
    return bool(os.statvfs(path).f_flag & os.ST_NOSUID)


def test_setuid_setgid(reg, progs):
    """Root running a program set-user-ID nobody changes its effective id:
    secure mode, warned.  Set-user-ID root run by root changes nothing: the
    loader honours LD_PRELOAD, no warning."""
    suid, sgid, suid_root = (os.path.join(progs, n) for n in ("suid", "sgid", "suid_root"))
    for p in (suid, sgid, suid_root):
        shutil.copy(os.path.join(progs, "dyn"), p)
    os.chown(suid, 65534, -1)
    os.chmod(suid, 0o4755)
    os.chown(sgid, -1, 65534)
    os.chmod(sgid, 0o2755)
    os.chmod(suid_root, 0o4755)
    if os.getuid() != 0:
        pytest.fail("needs root (chown), as the rest of the suite")
    if nosuid(progs):       # the kernel ignores the bits there: nothing to warn about
        assert warnings(run([suid], reg.env)) == []
        return
    assert_one_warning(run([suid], reg.env), "set-user-ID", "(uid 65534)",
                       "ignores LD_PRELOAD")
    assert_one_warning(run([sgid], reg.env), "set-group-ID", "(gid 65534)")
    r = run([suid_root], reg.env)
    assert r.returncode == 0 and warnings(r) == [], r.stderr


def test_file_capabilities(progs, tmp_path):
    """File capabilities put a program run by anyone but root in secure
    mode; root gets no warning (it gains nothing)."""
    need("setcap")
    capped = os.path.join(progs, "capped")
    shutil.copy(os.path.join(progs, "dyn"), capped)
    os.chmod(capped, 0o755)
    subprocess.run(["setcap", "cap_net_bind_service+ep", capped], check=True, timeout=30)
    regdir = tempfile.mkdtemp(prefix="smclo-inspect-reg-", dir="/tmp")
    os.chmod(regdir, 0o777)
    env = dict(os.environ, SMCLO_DIR=os.path.join(regdir, "r"))
    try:
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        r = run([capped], env, prefix=as_nobody)
        if nosuid(progs):
            assert warnings(r) == [], r.stderr
        else:
            assert_one_warning(r, "file capabilities")
        r = run([capped], env)
        assert r.returncode == 0 and warnings(r) == [], r.stderr
    finally:
        shutil.rmtree(regdir, ignore_errors=True)


def test_launchers_that_drop_ld_preload(reg, progs):
    dyn = os.path.join(progs, "dyn")
    for args, words in ((["env", "-i", dyn], ["env -i"]),
                        (["env", "-u", "LD_PRELOAD", dyn], ["env -u LD_PRELOAD"]),
                        (["env", "--unset=LD_PRELOAD", dyn], ["--unset=LD_PRELOAD"]),
                        (["env", "LD_PRELOAD=", dyn], ["replaces smclo's library"])):
        assert_one_warning(run(args, reg.env), *words)
    # sudo (not installed on every machine: a stand-in of that name)
    bindir = os.path.join(progs, "bin")
    os.makedirs(bindir, exist_ok=True)
    shutil.copy(os.path.join(progs, "dyn"), os.path.join(bindir, "sudo"))
    env = dict(reg.env, PATH=bindir + ":" + reg.env["PATH"])
    assert_one_warning(run(["sudo", "true"], env), "sudo", "removes LD_PRELOAD")


def test_launcher_scripts_followed(reg, progs):
    """`#!` lines: env -S -i drops the variable; env PROGRAM and a direct
    interpreter are followed to the program that will run."""
    cases = (("#!/usr/bin/env -S -i %s\n" % os.path.join(progs, "dyn"), ["env -i"]),
             ("#!/usr/bin/env %s\n" % os.path.join(progs, "gocgo"), ["a Go program"]),
             ("#!%s\n" % os.path.join(progs, "static"), ["statically linked"]))
    for i, (line, words) in enumerate(cases):
        script = os.path.join(progs, "launch%d" % i)
        with open(script, "w") as f:
            f.write(line)
        os.chmod(script, 0o755)
        w = assert_one_warning(run([script], reg.env), *words)
        assert w.startswith(WARN + script + " -> "), w


def test_program_not_found_is_named(reg):
    r = run(["smclo-no-such-program"], reg.env)
    assert r.returncode == 127
    assert "smclo-no-such-program: command not found" in r.stderr, r.stderr
    r = run(["/nonexistent/prog"], reg.env)
    assert r.returncode == 127
    assert "cannot start /nonexistent/prog: No such file or directory" in r.stderr, r.stderr
