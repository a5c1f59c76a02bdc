"""What connecting to a plain (non-smclo) server costs an smclo client: no
system call beyond its own once it has looked.  The registry counts the
listeners added, so a client that found nobody listening on a port through
smclo keeps that answer until the count moves (registry.h,
registry_port_unlistened) - yet a listener that appears later on that port
is found by the very next connect()."""
import os
import subprocess

from conftest import PY, SMCLO, TESTBIN, free_port, need, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def test_clients_of_a_plain_server_do_not_look_again(reg, procs, tmp_path):
    need("strace")
    port = free_port()
    worker = [str(TESTBIN.parent / "smclo"), "__bench-worker"]
    srv = procs.start(worker + ["server", str(port), "connect", "100", "0"], env=reg.env,
                      smclo=False)
    wait_port(port, proc=srv)
    trace = tmp_path / "client.strace"
    r = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e",
                        "trace=newfstatat,getsockopt,getsockname", SMCLO, "run", "--"] +
                       worker + ["client", str(port), "connect", "100", "1"], env=reg.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    conns = float(r.stdout.split("value ")[1].split()[0])
    assert conns >= 200, r.stdout
    lines = open(trace).read().splitlines()
    looks = [l for l in lines if 'newfstatat(' in l and '"l"' in l]
    asked = [l for l in lines if "SO_NETNS_COOKIE" in l or "getsockname(" in l]
    # the first connect looks, and so may the one after the registry was made
    assert len(looks) <= 2 and len(asked) <= 4, "\n".join(looks + asked)
    st = reg.stats()
    assert st["fallback_by_reason"]["peer-no-smclo"] >= 200, st


CLIENT = r"""
import socket, sys
for line in sys.stdin:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    c.sendall(b"ping")
    print(c.recv(16).decode(), flush=True)
    c.close()
"""


def test_a_listener_added_later_is_found(reg, procs):
    """One client process: first a plain server on the port (the client
    remembers nobody listens there through smclo), then an smclo one."""
    port = free_port()
    plain = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], env=reg.env, smclo=False,
                        text=True)
    assert plain.stdout.readline().strip() == "ready"
    cli = procs.start([PY, "-c", CLIENT, str(port)], env=reg.env, text=True,
                      stdin=subprocess.PIPE)
    for _ in range(2):
        cli.stdin.write("go\n")
        cli.stdin.flush()
        assert cli.stdout.readline().strip() == "ping"
    st = reg.stats()
    assert st["accelerated"] == 0 and st["fallback_by_reason"]["peer-no-smclo"] == 2, st

    procs.stop(plain)
    srv = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], env=reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    cli.stdin.write("go\n")
    cli.stdin.flush()
    assert cli.stdout.readline().strip() == "ping"
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 1)
    assert st["accelerated_client"] == 1 and st["accelerated_server"] == 1, st
