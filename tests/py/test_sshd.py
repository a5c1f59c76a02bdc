"""OpenSSH under smclo, as Debian starts it.

sshd is started as root the way Debian's unit does (`/usr/sbin/sshd -D`)
with Debian's packaged /etc/ssh/sshd_config, so with everything that makes
sshd hard on an LD_PRELOAD library: privilege separation (a monitor as
root, an unprivileged, chrooted child that speaks to the network before
authentication), a re-exec of sshd for every connection (the connection
crosses an exec), and that child's seccomp sandbox, which kills it with
SIGSYS on any system call it does not expect - smclo's own included.  The
test's configuration only adds what a private instance needs: its port on
127.0.0.1, a host key, a pid file, and a file of authorized keys (root logs
in with a key: PermitRootLogin prohibit-password is Debian's default).  That
directory lives under /run, not /tmp: StrictModes (on) refuses a key file
below a world-writable directory.

Every client runs under smclo too: ssh, scp, sftp, rsync -e ssh and
`git clone ssh://`.  For each: bytes exact (sha256), sshd still running and
its log (-e: stderr) without a child killed by a signal or a fatal error,
and every session accelerated at its handshake at both ends
(`smclo stats`: accelerated_client and accelerated_server), then moved to
TCP before sshd's privilege-separated child confines itself: counted
`sandbox` at sshd's end and `peer-moved` at the client's (moved_by_reason),
once per session at least; no connection left on TCP for any reason.

`python3 test_sshd.py` runs the same sessions with no smclo at all (plain
TCP): a check of the harness itself.
"""
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import SMCLO, default_env, free_port, need, wait_port
from test_servers import named, scratch  # noqa: F401

SSHD = "/usr/sbin/sshd"
MIB = 1 << 20
# what a child killed by a signal, or any other failure of sshd, leaves in its log
TROUBLE = re.compile(r"killed by signal|terminated by signal|SIGSYS|signal 31|fatal|"
                     r"segfault|Bad owner|bad ownership", re.I)


def sandbox_kills():
    """The kernel's audit records of sshd processes a seccomp filter killed
    (type=1326 ... sig=31 syscall=N): a preauth child dies so without a word
    in sshd's own log (its monitor just exits).  Empty where the kernel log
    cannot be read or goes to auditd."""
    r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    return {l for l in r.stdout.splitlines()
            if "type=1326" in l and 'exe="%s"' % SSHD in l and "sig=31" in l}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def random_file(path, size):
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    return sha256(path)


def keys_dir():
    """A directory for sshd's configuration and keys: under /run, as StrictModes
    refuses an authorized keys file below a world-writable directory (/tmp)."""
    return Path(tempfile.mkdtemp(prefix="smclo-sshd-", dir="/run"))


class Sshd:
    """A private sshd (its files in @keys), started under smclo (reg: the
    registry whose env it and its clients get) or, with reg None, on plain
    TCP; @data is the clients' scratch directory."""

    def __init__(self, procs, keys, data, reg=None):
        for b in (SSHD, "ssh", "ssh-keygen"):
            need(b)
        self.reg, self.keys, self.data = reg, Path(keys), Path(data)
        self.env = reg.env if reg else default_env()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)     # the privsep chroot
        for name in ("host", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                            "-f", str(self.keys / name)], check=True, timeout=30)
        shutil.copy(self.keys / "id.pub", self.keys / "authorized_keys")
        self.port = free_port()
        cfg = self.keys / "sshd_config"
        # sshd keeps the first value it reads: ours, then Debian's whole file
        cfg.write_text("Port %d\nListenAddress 127.0.0.1\nHostKey %s/host\nPidFile %s/pid\n"
                       "AuthorizedKeysFile %s/authorized_keys\n\n" % (
                           self.port, self.keys, self.keys, self.keys)
                       + open("/etc/ssh/sshd_config").read())
        self.log = self.keys / "sshd.log"
        self.kills_before = sandbox_kills()
        with open(self.log, "wb") as logf:
            self.proc = procs.start([SSHD, "-D", "-e", "-f", str(cfg)], self.env,
                                    smclo=reg is not None, stdout=logf,
                                    stderr=subprocess.STDOUT)
        try:
            wait_port(self.port, proc=self.proc)
        except RuntimeError as e:
            raise RuntimeError("%s (status %s)\nsshd's log:\n%s" % (
                e, self.proc.returncode, self.log.read_text(errors="replace")))
        self.opts = ["-i", str(self.keys / "id"), "-o", "Port=%d" % self.port,
                     "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                     "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]
        self.ssh = "ssh " + " ".join(self.opts)     # for rsync -e and GIT_SSH_COMMAND

    def run(self, args, input=None, cwd=None, env=None):
        """A client to completion (under smclo when sshd is); it must succeed."""
        cmd = ([SMCLO, "run", "--"] if self.reg else []) + [str(a) for a in args]
        r = subprocess.run(cmd, env=env or self.env, input=input, cwd=cwd,
                           capture_output=True, timeout=60)
        assert r.returncode == 0, "%s: exit %d\n%s\nsshd's log:\n%s\n%s" % (
            " ".join(cmd), r.returncode, (r.stdout + r.stderr).decode(errors="replace")[-2000:],
            self.log_text()[-3000:], self.killed())
        return r.stdout

    def log_text(self):
        return self.log.read_text(errors="replace")

    def killed(self):
        new = sorted(sandbox_kills() - self.kills_before)
        return "killed by its seccomp filter (kernel log):\n" + "\n".join(new) if new else ""

    def healthy(self):
        assert self.proc.poll() is None, "sshd exited with %s:\n%s" % (
            self.proc.returncode, self.log_text()[-3000:])
        bad = [l for l in self.log_text().splitlines() if TROUBLE.search(l)]
        assert not bad, "sshd's log:\n" + "\n".join(bad)
        assert not self.killed(), self.killed()


def accelerated(reg, sessions, record_property):
    """Every ssh session accelerated at its handshake, at both ends, and
    moved to TCP before sshd's sandbox (core/move.c); none left on TCP."""
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= sessions and
                        s["accelerated_server"] >= sessions and
                        s["moved_by_reason"]["peer-moved"] >= sessions)
    moved = st["moved_by_reason"]
    record_property("moved_to_tcp", moved["sandbox"])
    assert st["accelerated_client"] >= sessions and st["accelerated_server"] >= sessions, (
        "%d sessions; accelerated client %d, server %d; on TCP: %s" % (
            sessions, st["accelerated_client"], st["accelerated_server"], named(st)))
    assert moved["sandbox"] >= sessions and moved["peer-moved"] >= sessions, moved
    assert not named(st), "on TCP: %s" % named(st)
    return moved["sandbox"]


# ---- the sessions: each returns how many ssh connections it made ------------

def command(s):
    """ssh runs a command: its output exact."""
    out = s.run(["ssh"] + s.opts + ["root@127.0.0.1", "echo hello; cat /etc/hostname"])
    assert out.decode() == "hello\n" + open("/etc/hostname").read()
    return 1


def scp_both_ways(s):
    """scp of 30 MiB up, and back down."""
    d = s.data
    want = random_file(d / "up.src", 30 * MIB)
    s.run(["scp"] + s.opts + [d / "up.src", "root@127.0.0.1:%s" % (d / "up.dst")])
    assert sha256(d / "up.dst") == want
    s.run(["scp"] + s.opts + ["root@127.0.0.1:%s" % (d / "up.dst"), d / "down.dst"])
    assert sha256(d / "down.dst") == want
    return 2


def sftp_both_ways(s):
    """One sftp batch: 30 MiB put, another 30 MiB got."""
    d = s.data
    up, down = random_file(d / "a.src", 30 * MIB), random_file(d / "b.src", 30 * MIB)
    batch = "put %s %s\nget %s %s\n" % (d / "a.src", d / "a.dst", d / "b.src", d / "b.dst")
    s.run(["sftp", "-b", "-"] + s.opts + ["root@127.0.0.1"], input=batch.encode())
    assert sha256(d / "a.dst") == up and sha256(d / "b.dst") == down
    return 1


def tree(root):
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def rsync_tree(s):
    """rsync -a -e ssh of a directory of 61 files (8 MiB in one)."""
    need("rsync")
    src = s.data / "tree"
    for i in range(60):
        sub = src / ("d%d" % (i % 6))
        sub.mkdir(parents=True, exist_ok=True)
        random_file(sub / ("f%d" % i), (i * 37_001) % 300_000)
    random_file(src / "big", 8 * MIB)
    s.run(["rsync", "-a", "-e", s.ssh, "%s/" % src, "root@127.0.0.1:%s/" % (s.data / "copy")])
    assert tree(s.data / "copy") == tree(src)
    return 1


def git_clone(s):
    """git clone ssh:// of a bare repository: the same commit, the same blob."""
    need("git")
    d = s.data
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost",
           "-c", "init.defaultBranch=main"]
    subprocess.run(git + ["init", "-q", "--bare", d / "repo.git"], check=True, timeout=30)
    subprocess.run(git + ["init", "-q", d / "work"], check=True, timeout=30)
    blob = random_file(d / "work" / "blob", 2 * MIB)
    subprocess.run(git + ["-C", d / "work", "add", "blob"], check=True, timeout=30)
    subprocess.run(git + ["-C", d / "work", "commit", "-q", "-m", "one"], check=True, timeout=30)
    subprocess.run(git + ["-C", d / "work", "push", "-q", d / "repo.git", "main"], check=True,
                   timeout=30)
    head = subprocess.run(["git", "-C", d / "work", "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()
    s.run(["git", "clone", "-q", "ssh://root@127.0.0.1:%d%s" % (s.port, d / "repo.git"),
           d / "clone"], env=dict(s.env, GIT_SSH_COMMAND=s.ssh))
    got = subprocess.run(["git", "-C", d / "clone", "rev-parse", "HEAD"], check=True,
                         capture_output=True, text=True, timeout=30).stdout.strip()
    assert got == head and sha256(d / "clone" / "blob") == blob
    return 1


SESSIONS = [command, scp_both_ways, sftp_both_ways, rsync_tree, git_clone]


# ---- the tests --------------------------------------------------------------

@pytest.fixture
def sshd(default_reg, procs, scratch):  # noqa: F811
    """sshd under smclo, with the host's shared registry."""
    keys = keys_dir()
    try:
        yield Sshd(procs, keys, scratch("smclo-sshd-data-", 0o700), default_reg)
    finally:
        procs.stop_all()
        shutil.rmtree(keys, ignore_errors=True)


@pytest.mark.parametrize("session", SESSIONS, ids=[f.__name__ for f in SESSIONS])
def test_openssh(sshd, default_reg, record_property, session):
    """Bytes exact, sshd healthy (no child killed), every session accelerated."""
    n = session(sshd)
    sshd.healthy()
    accelerated(default_reg, n, record_property)


if __name__ == "__main__":
    # the same sessions on plain TCP: no smclo anywhere
    from conftest import Procs
    for session in SESSIONS:
        procs, keys, data = Procs(), keys_dir(), Path(tempfile.mkdtemp(prefix="smclo-sshd-"))
        try:
            s = Sshd(procs, keys, data)
            n = session(s)
            s.healthy()
            print("plain TCP: %-14s ok (%d ssh connection%s)" % (session.__name__, n,
                                                                  "s" * (n > 1)))
        finally:
            procs.stop_all()
            shutil.rmtree(keys, ignore_errors=True)
            shutil.rmtree(data, ignore_errors=True)
