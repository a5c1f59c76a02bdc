"""A registry shared by the users of a container, looked at by root first.

Two containers running as uid 999 share a registry directory on a volume
(docs/containers.md).  If root runs `smclo stat` on the host before them, it
makes the registry's subdirectories: they must be the registry owner's, with
the registry's own mode, or every lookup of the containers fails and nothing
is accelerated.  And a lookup this process may not make (the listeners'
directory is not ours to read) is named no-registry, never peer-no-smclo:
the peer may well run smclo.
"""
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

from conftest import SMCLO, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
PY3 = "/usr/bin/python3"        # one every user may run (pytest's may live under /root)
UID = 999


def as_user(uid, args):
    return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups", "--"] + args


@pytest.fixture
def regdir():
    d = tempfile.mkdtemp(prefix="smclo-perms-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def stats(env):
    import json
    out = subprocess.run([SMCLO, "stats", "--json"], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


ROOT_FIRST = {
    "stats": lambda env: stats(env),
    # a program of root's connecting through it (nobody listens): it maps
    # the registry's shared page, which it may have to make
    "connect": lambda env: subprocess.run(
        [SMCLO, "run", "--", PY3, "-c", "import socket; socket.socket().connect_ex(('127.0.0.1', 9))"],
        env=env, check=True, timeout=60),
}


@pytest.mark.parametrize("first", sorted(ROOT_FIRST))
def test_root_looking_first_leaves_the_registry_its_owners(regdir, procs, first):
    os.chown(regdir, UID, UID)
    os.chmod(regdir, 0o700)
    env = dict(os.environ, SMCLO_DIR=regdir, SMCLO_SHORT_LIVED="0")
    ROOT_FIRST[first](env)                  # root, on the host, first
    subs = [e for e in os.scandir(regdir) if e.is_dir(follow_symlinks=False)]
    assert subs or first != "stats", "smclo stats made no subdirectory"
    for e in subs:
        st = os.stat(e.path, follow_symlinks=False)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID, UID, 0o700), e.path
    for e in os.scandir(regdir):            # files: the owner's too (t/0 is root's own totals)
        if e.is_file(follow_symlinks=False):
            assert os.stat(e.path, follow_symlinks=False).st_uid == UID, e.path
    port = free_port()
    srv = procs.start(as_user(UID, [SMCLO, "run", "--", PY3, PEER, "echo-many", "127.0.0.1",
                                    str(port)]), env, smclo=False)
    wait_port(port, proc=srv)
    r = subprocess.run(as_user(UID, [SMCLO, "run", "--", PY3, PEER, "churn", "127.0.0.1",
                                     str(port), "10"]),
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = stats(env)
    assert st["accelerated_client"] == 10 and st["fallback"] == 0, st


def test_a_lookup_refused_is_named(regdir, procs):
    """The listeners' directory is root's alone; a client of another user
    cannot look there, and says so: no-registry, not peer-no-smclo."""
    os.chmod(regdir, 0o755)
    env = dict(os.environ, SMCLO_DIR=regdir, SMCLO_SHORT_LIVED="0")
    stats(env)
    for e in os.scandir(regdir):
        os.chmod(e.path, 0o700 if e.name == "l" else 0o1777)
    port = free_port()
    srv = procs.start([SMCLO, "run", "--", PY3, PEER, "echo-many", "127.0.0.1", str(port)],
                      env, smclo=False)
    wait_port(port, proc=srv)
    r = subprocess.run(as_user(UID, [SMCLO, "run", "--", PY3, PEER, "churn", "127.0.0.1",
                                     str(port), "5"]),
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = stats(env)
    by = st["fallback_by_reason"]
    assert by["no-registry"] == 5 and by["peer-no-smclo"] == 5, by     # client, server
    assert by["timeout"] == 0 and st["accelerated"] == 0, st
