"""Short-lived connections stay on TCP while CPU time is short (payoff.h,
cpus.h): more busy loops than CPUs, one CPU allowed, or a cgroup quota of
one CPU on the process's cgroup or its parent.  A client whose connections to a
server each carry one small round trip stops offering after a few, says why
(`short-lived`), and keeps trying one now and then; what the clients learn
is shared through the registry, so processes that make one connection each
learn from each other; an answer read in pieces is one message, while
connections that carry more round trips or more bytes are accelerated
regardless, and SMCLO_SHORT_LIVED=0 accelerates all.  All of that is about
connections set up over TCP: the servers here take none without
(SMCLO_DIRECT=0), except the last test's, whose connections cost less than
TCP's to set up and so are never kept on it."""
import os
import sys

import pytest

from conftest import PY, cgroup_top, cpu_quota_files, free_port, make_cgroup, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


@pytest.fixture
def busy_cpus(procs):
    """More runnable busy loops than CPUs (and a margin), for the test's length."""
    n = (os.cpu_count() or 2) + 3
    hogs = [procs.start([sys.executable, "-c", "while True: pass"], env=os.environ, smclo=False)
            for _ in range(n)]
    yield hogs
    for h in hogs:
        procs.stop(h)


def run_clients(reg, procs, role, conns, short_lived, processes=1, prefix=(), direct="0"):
    """An echo server (taking connections without TCP if @direct is "1", at
    both ends: the opt-in) and
    @processes clients in turn, each making @conns connections of kind
    @role; both run under @prefix (a command such as taskset)."""
    env = dict(reg.env, SMCLO_SHORT_LIVED=short_lived, SMCLO_DIRECT=direct)
    port = free_port()
    srv = procs.start([*prefix, PY, PEER, "echo", "127.0.0.1", str(port)], env=env)
    wait_port(port, proc=srv)
    for _ in range(processes):
        r = reg.run([*prefix, PY, PEER, role, "127.0.0.1", str(port), str(conns)], env=env,
                    timeout=300)
        assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    # every connection was decided by the time its echo came back
    return reg.wait_stats(lambda s: s["accelerated_client"] +
                          s["fallback_by_reason"].get("short-lived", 0) >= conns * processes)


def test_short_connections_stay_on_tcp_while_cpus_are_busy(reg, procs, busy_cpus):
    st = run_clients(reg, procs, "short", 300, "1")
    short = st["fallback_by_reason"].get("short-lived", 0)
    # the first ones are accelerated (they teach the client), most of the rest are not,
    # and a few of those are tried anyway: of 292 kept on TCP the 256th is a probe
    # (the first probe is never held back by the 250 ms gap)
    assert st["accelerated_client"] >= 8 + 1, st
    assert short >= 200, st
    assert st["accelerated_client"] + short == 300, st
    # the server cannot tell a client that kept TCP from one without smclo;
    # stats leaves those ends out of the fallbacks a benchmark must not have
    assert st["fallback_by_reason"].get("peer-no-smclo", 0) == short, st
    assert st["fallback_not_short_lived"] == 0, st


def test_short_connections_stay_on_tcp_on_one_allowed_cpu(reg, procs):
    # no busy loops: a client and server pinned to one CPU (a container's
    # cpuset) pay every connection's extra CPU one after the other
    st = run_clients(reg, procs, "short", 100, "1", prefix=("taskset", "-c", "0"))
    short = st["fallback_by_reason"].get("short-lived", 0)
    assert st["accelerated_client"] >= 8, st
    assert short >= 80, st
    assert st["accelerated_client"] + short == 100, st


@pytest.fixture(params=["own", "parent"])
def one_cpu_quota(request, procs):
    """A cgroup under a CPU quota of one CPU (v1's cpu controller, else v2's
    cpu.max), set on the cgroup itself or on its parent (a container's
    limit on a pod or a slice above it); yields the prefix that starts a
    command in it."""
    top, v1 = cgroup_top("cpu", "cpu", "cpu.cfs_quota_us")
    outer = os.path.join(top, "smclo-test-%d" % os.getpid())
    made = [outer]
    join = make_cgroup(outer, cpu_quota_files(v1))
    if request.param == "parent":
        if not v1:
            with open(os.path.join(outer, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
        made.append(os.path.join(outer, "inner"))
        join = make_cgroup(made[-1], {})        # no quota of its own
    yield join
    procs.stop_all()    # a cgroup goes once its processes have
    for path in reversed(made):
        os.rmdir(path)


def test_short_connections_stay_on_tcp_under_a_one_cpu_quota(reg, procs, one_cpu_quota):
    # a container's --cpus=1 on a 2-CPU machine: both CPUs allowed, one CPU's
    # worth of time for client and server together
    st = run_clients(reg, procs, "short", 100, "1", prefix=one_cpu_quota)
    short = st["fallback_by_reason"].get("short-lived", 0)
    assert st["accelerated_client"] >= 8, st
    assert short >= 80, st
    assert st["accelerated_client"] + short == 100, st


# A cgroup2-shaped tree in a private mount namespace, and /proc/self/cgroup
# naming /pod/ctr in it: $1 is the parent's cpu.max, $2 the cgroup's own
V2_TREE = ('mount -t tmpfs smclo-test /sys/fs/cgroup && cd /sys/fs/cgroup && '
           ': > cgroup.controllers && mkdir -p pod/ctr && echo "$1" > pod/cpu.max && '
           'echo "$2" > pod/ctr/cpu.max && echo 0::/pod/ctr > self && '
           'mount --bind self /proc/$$/cgroup && cd / && shift 2 && exec "$@"')


@pytest.fixture(params=["own", "parent"])
def v2_quota_as_a_container_sees_it(request):
    """cgroup v2's cpu.max as a process on a v2 host sees it (Debian 12's
    default; this test host has its cpu controller on v1, which the fixture
    above makes real cgroups of): a quota of one CPU on the process's cgroup
    or its parent, the other "max".  The kernel enforces nothing there: what
    is tested is smclo's reading of the tree (cpus.c), the v2 branch; the
    prefix that starts a command so."""
    one, none = "100000 100000", "max 100000"
    parent, own = (none, one) if request.param == "own" else (one, none)
    return ("unshare", "-m", "sh", "-c", V2_TREE, "sh", parent, own)


def test_short_connections_stay_on_tcp_under_a_v2_quota(reg, procs,
                                                        v2_quota_as_a_container_sees_it):
    st = run_clients(reg, procs, "short", 100, "1", prefix=v2_quota_as_a_container_sees_it)
    short = st["fallback_by_reason"].get("short-lived", 0)
    assert st["accelerated_client"] >= 8, st
    assert short >= 80, st
    assert st["accelerated_client"] + short == 100, st


def test_short_connections_stay_accelerated_without_a_v2_quota(reg, procs):
    # the same tree with no quota anywhere: the control of the test above
    none = "max 100000"
    st = run_clients(reg, procs, "short", 100, "1",
                     prefix=("unshare", "-m", "sh", "-c", V2_TREE, "sh", none, none))
    assert st["accelerated_client"] == 100 and st["fallback"] == 0, st


def test_a_connect_repeated_after_tcp_is_the_kernels(reg, procs, busy_cpus):
    """An event loop connects without blocking and calls connect() again
    once the socket is writable (ab, apr).  Kept on TCP as short-lived, the
    second call must not start a handshake of its own: a probe landing on it
    made the connection pending again and answered EINPROGRESS, a failed
    connect for ab.  Probes come every 256 calls, 250 ms apart at most, so
    600 connections meet several, on either call."""
    st = run_clients(reg, procs, "short-nb", 600, "1")
    short = st["fallback_by_reason"].get("short-lived", 0)
    assert short >= 400 and st["accelerated_client"] + short == 600, st


def test_one_connection_processes_learn_from_each_other(reg, procs, busy_cpus):
    # a shell loop of one-request clients: no process lives to see a streak of its own
    st = run_clients(reg, procs, "short", 1, "1", processes=24)
    short = st["fallback_by_reason"].get("short-lived", 0)
    assert st["accelerated_client"] >= 8, st
    assert short >= 12, st
    assert st["accelerated_client"] + short == 24, st


def test_connections_that_carry_more_stay_accelerated(reg, procs, busy_cpus):
    st = run_clients(reg, procs, "chatty", 100, "1")
    assert st["accelerated_client"] == 100 and st["fallback"] == 0, st


def test_an_answer_read_in_pieces_is_one_message(reg, procs, busy_cpus):
    # one request and its answer (6000 bytes each way, 12 KB in all), the
    # answer read in six pieces: seven calls, two messages - short (payoff.c)
    st = run_clients(reg, procs, "bulk", 100, "1")
    short = st["fallback_by_reason"].get("short-lived", 0)
    assert st["accelerated_client"] >= 8 and short >= 50, st
    assert st["accelerated_client"] + short == 100, st


def test_one_round_trip_of_300_kb_stays_accelerated(reg, procs, busy_cpus):
    st = run_clients(reg, procs, "bulk-long", 40, "1")
    assert st["accelerated_client"] == 40 and st["fallback"] == 0, st


def test_short_lived_policy_can_be_turned_off(reg, procs, busy_cpus):
    st = run_clients(reg, procs, "short", 100, "0")
    assert st["accelerated_client"] == 100 and st["fallback"] == 0, st


def test_connections_without_tcp_are_never_kept_on_tcp(reg, procs, busy_cpus):
    # the server blocks in accept(): after the first connection (an inbox
    # handshake over TCP) it takes them without TCP, which costs less than
    # TCP's set-up however short they are
    st = run_clients(reg, procs, "short", 300, "1", direct="1")
    assert st["accelerated_client"] == 300 and st["fallback"] == 0, st
    assert st["direct_handshakes"] >= 299, st
