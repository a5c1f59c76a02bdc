"""The handshake decides once: when one side gives up, both stay on TCP and
no byte is lost, whichever side was late (handshake.c, top of file)."""
import os
import signal
import time

from conftest import PY, free_port, wait_port

SLOW = os.path.join(os.path.dirname(__file__), "slowpeer.py")


def echo_ok(out):
    got, sent = out.split()
    return got == sent


def test_client_gives_up_first(reg, procs):
    """The server accepts after the client's timeout: the client's rendezvous
    is gone, so the server finds nobody to answer and both use TCP."""
    port = free_port()
    srv = procs.start([PY, SLOW, "server", str(port), "0.6"], env=reg.env)
    wait_port(port, proc=srv)
    cli = procs.start([PY, SLOW, "client", str(port), "300000"],
                      env=dict(reg.env, SMCLO_HANDSHAKE_MS="100"), text=True)
    out, _ = cli.communicate(timeout=30)
    assert cli.returncode == 0 and echo_ok(out)
    srv.wait(timeout=10)
    st = reg.stats()
    assert st["accelerated_client"] == 0 and st["accelerated_server"] == 0, st
    assert st["fallback_by_reason"]["timeout"] == 1, st           # the client
    assert st["fallback_by_reason"]["peer-no-smclo"] == 1, st     # the server


def test_server_gives_up_first(reg, procs):
    """The client is stopped while the server's ACCEPT waits in its queue;
    the server stops waiting for CONFIRM and takes TCP, and the client, once
    resumed, cannot deliver its CONFIRM (EPIPE) and stays on TCP too."""
    port = free_port()
    srv = procs.start([PY, SLOW, "server", str(port), "0.5"],
                      env=dict(reg.env, SMCLO_HANDSHAKE_MS="100"))
    wait_port(port, proc=srv)
    cli = procs.start([PY, SLOW, "client", str(port), "300000"],
                      env=dict(reg.env, SMCLO_HANDSHAKE_MS="10000"), text=True)
    time.sleep(0.25)                     # the client waits for ACCEPT by now
    os.killpg(cli.pid, signal.SIGSTOP)
    time.sleep(1.0)                      # the server answered and gave up
    os.killpg(cli.pid, signal.SIGCONT)
    out, _ = cli.communicate(timeout=30)
    assert cli.returncode == 0 and echo_ok(out)
    srv.wait(timeout=10)
    st = reg.stats()
    assert st["accelerated_client"] == 0 and st["accelerated_server"] == 0, st
    assert st["fallback_by_reason"]["timeout"] == 2, st
