"""The handshake decides once: when one side gives up, both stay on TCP and
no byte is lost, whichever side was late.  Both handshakes: the rendezvous
(handshake.h, top of file; a listener two processes hold) and the inbox
(inbox.h; a listener only one process holds)."""
import os
import signal
import time

import pytest

from conftest import PY, free_port, wait_port

SLOW = os.path.join(os.path.dirname(__file__), "slowpeer.py")


def start_pair(reg, procs, tmp_path, server_ms, client_ms, forked=True, server_env=None,
               nbytes=300000):
    port = free_port()
    gate = tmp_path / "gate"
    env = dict(reg.env, SMCLO_HANDSHAKE_MS=str(server_ms), **(server_env or {}))
    srv = procs.start([PY, SLOW, "server", str(port), str(gate)] + (["forked"] if forked else []),
                      env=env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    wait_port(port, proc=srv)
    # forked: the rendezvous, which the client takes (SMCLO_INBOX=0) instead
    # of the inbox the server's child shares with its parent
    cenv = dict(reg.env, SMCLO_HANDSHAKE_MS=str(client_ms), **({"SMCLO_INBOX": "0"} if forked else {}))
    cli = procs.start([PY, SLOW, "client", str(port), str(nbytes)], env=cenv, text=True)
    assert cli.stdout.readline().strip() == "connecting"
    return srv, cli, gate


def finish(reg, srv, cli):
    verdict = cli.stdout.readline().strip()
    cli.wait(timeout=30)
    srv.wait(timeout=10)
    assert cli.returncode == 0 and verdict == "match"
    st = reg.stats()
    assert st["accelerated_client"] == 0 and st["accelerated_server"] == 0, st
    return st


def test_client_gives_up_first(reg, procs, tmp_path):
    """The server accepts after the client's timeout: the client's rendezvous
    is gone, so the server finds nobody to answer and both use TCP."""
    srv, cli, gate = start_pair(reg, procs, tmp_path, 10000, 100)
    time.sleep(0.6)                      # well past the client's 100 ms
    gate.touch()
    st = finish(reg, srv, cli)
    assert st["fallback_by_reason"]["timeout"] == 1, st           # the client
    assert st["fallback_by_reason"]["peer-no-smclo"] == 1, st     # the server


def test_server_gives_up_first(reg, procs, tmp_path):
    """The client is stopped while the server's ACCEPT waits in its queue;
    the server stops waiting for CONFIRM and takes TCP, and the client, once
    resumed, cannot deliver its CONFIRM (EPIPE) and stays on TCP too."""
    srv, cli, gate = start_pair(reg, procs, tmp_path, 100, 10000)
    time.sleep(0.3)                      # the client waits for ACCEPT by now
    os.killpg(cli.pid, signal.SIGSTOP)
    gate.touch()
    assert srv.stdout.readline().strip() == "accepted"   # after its 100 ms wait
    os.killpg(cli.pid, signal.SIGCONT)
    st = finish(reg, srv, cli)
    assert st["fallback_by_reason"]["timeout"] == 2, st


@pytest.mark.parametrize("nbytes", [100, 300000])
def test_inbox_client_gives_up_first(reg, procs, tmp_path, nbytes):
    """The server accepts after the client withdrew its offer: the server
    finds the offer in its inbox, loses the swap, and both use TCP.  100
    bytes fit in the ring while the offer is undecided: they are replayed
    into the TCP socket when it is withdrawn."""
    srv, cli, gate = start_pair(reg, procs, tmp_path, 10000, 100, forked=False, nbytes=nbytes)
    time.sleep(0.6)
    gate.touch()
    st = finish(reg, srv, cli)
    assert st["fallback_by_reason"]["timeout"] == 1, st           # the client
    assert st["fallback_by_reason"]["peer-withdrew"] == 1, st     # the server
    assert st["inbox_handshakes"] == 0, st


@pytest.mark.parametrize("nbytes", [100, 300000])
def test_inbox_decline_is_answered_at_once(reg, procs, tmp_path, nbytes):
    """A server that may not accelerate (SMCLO_MAX_CONNS=0) declines the offer
    with its reason; the client hears it at once instead of timing out, and
    what it wrote while undecided is replayed into TCP."""
    srv, cli, gate = start_pair(reg, procs, tmp_path, 10000, 10000, forked=False,
                                server_env={"SMCLO_MAX_CONNS": "0"}, nbytes=nbytes)
    gate.touch()
    t0 = time.monotonic()
    st = finish(reg, srv, cli)
    assert time.monotonic() - t0 < 5
    assert st["fallback_by_reason"]["max-buffers"] == 2, st       # both ends, one reason
