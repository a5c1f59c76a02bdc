"""Containers: two network namespaces joined by a veth pair.  Sharing the
registry directory they are accelerated; with separate directories they fall
back to TCP."""
import os
import subprocess

from conftest import PY, VETH_NET, Registry, free_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def exchange(procs, ns_server, ns_client, server_reg, client_reg):
    from conftest import SMCLO
    port = free_port()
    srv = procs.start(["ip", "netns", "exec", ns_server, SMCLO, "run", "--", PY, PEER, "echo",
                       "0.0.0.0", str(port)], server_reg.env, smclo=False, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = subprocess.run(["ip", "netns", "exec", ns_client, SMCLO, "run", "--", PY, PEER, "send",
                        VETH_NET + "1", str(port), str(2 << 20)], env=client_reg.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "match", r.stdout + r.stderr
    procs.stop(srv)


def test_shared_registry_accelerates(two_namespaces, procs, tmp_path):
    a, b = two_namespaces
    reg = Registry(tmp_path / "shared")
    exchange(procs, a, b, reg, reg)
    st = reg.stats()
    assert st["accelerated_server"] == 1 and st["accelerated_client"] == 1, st
    assert st["fallback"] == 0, st["fallback_by_reason"]


def test_separate_registries_fall_back(two_namespaces, procs, tmp_path):
    a, b = two_namespaces
    ra, rb = Registry(tmp_path / "a"), Registry(tmp_path / "b")
    exchange(procs, a, b, ra, rb)
    assert ra.stats()["fallback_by_reason"]["peer-no-smclo"] == 1
    assert rb.stats()["fallback_by_reason"]["peer-no-smclo"] == 1
    assert ra.stats()["accelerated"] == 0 and rb.stats()["accelerated"] == 0


def test_cross_namespace_can_be_switched_off(two_namespaces, procs, tmp_path):
    a, b = two_namespaces
    reg = Registry(tmp_path / "shared")
    off = Registry(tmp_path / "shared")
    off.env["SMCLO_CROSS_NETNS"] = "0"
    exchange(procs, a, b, reg, off)
    st = reg.stats()
    assert st["accelerated"] == 0
    assert st["fallback_by_reason"]["cross-netns-off"] == 1, st
