"""How a waiter watches depends on where its peer runs (spin.h): with each
end confined to a CPU of its own (taskset, a cpuset cgroup), a
ping-pong's reader spins on its ring and sleeps almost never; with both
confined to one CPU it yields that CPU to the peer between looks (a spin
there would only keep the peer from running, a sleep costs a wake-up);
under a CPU quota it spins as unconfined.

What is asserted is the reader's behaviour, not a speed: the client's
context switches against its round trips, which the benchmark worker
reports.  A sleep is a voluntary switch; a yield that lets the peer run is
an involuntary one (the yielder stays runnable).  A reader that slept at
every round trip would switch voluntarily about once every one or two; one
that spins or yields, a small fraction of that, and one that yields,
involuntarily about once a round trip."""
import os
import subprocess

import pytest

from conftest import SMCLO, cgroup_top, cpu_quota_files, free_port, make_cgroup, wait_port

SECONDS = "1"


def ping_pong(reg, procs, server_prefix=(), client_prefix=()):
    """The 100 B ping-pong of `make bench` for SECONDS, each end under its
    prefix; (round trips, the client's voluntary and involuntary context
    switches)."""
    port = free_port()
    srv = procs.start([*server_prefix, SMCLO, "__bench-worker", "server", str(port),
                       "pingpong", "100", "0"], env=reg.env)
    wait_port(port, proc=srv)
    cli = subprocess.Popen([SMCLO, "run", "--", *client_prefix, SMCLO, "__bench-worker",
                            "client", str(port), "pingpong", "100", SECONDS],
                           env=reg.env, stdout=subprocess.PIPE, text=True)
    out = cli.stdout.read()
    _, status, ru = os.wait4(cli.pid, 0)
    assert status == 0, out
    us_per_round = float(out.split("value ")[1].split()[0])
    rounds = float(SECONDS) * 1e6 / us_per_round
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 1)
    assert st["accelerated_client"] == 1 and st["fallback"] == 0, st
    return rounds, ru.ru_nvcsw, ru.ru_nivcsw


def pinned(cpu):
    return ("taskset", "-c", str(cpu))


needs_two_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: nothing to place")


@needs_two_cpus
def test_pinned_to_different_cpus_the_reader_spins(reg, procs):
    rounds, switches, _ = ping_pong(reg, procs, pinned(0), pinned(1))
    assert rounds > 1000 and switches < rounds / 10, (rounds, switches)


@needs_two_cpus
def test_pinned_to_one_cpu_the_reader_yields(reg, procs):
    rounds, switches, yields = ping_pong(reg, procs, pinned(0), pinned(0))
    # a busy spin there would hold the CPU until the tick: a few hundred
    # round trips a second; a sleeping reader (before) switched voluntarily
    # about once every two round trips
    assert rounds > 10000 and switches < rounds / 10 and yields >= rounds / 4, \
        (rounds, switches, yields)


@pytest.fixture
def cpusets(procs):
    """Two cpuset cgroups of one CPU each (v1's cpuset controller, else v2's),
    as Kubernetes' static CPU manager gives two pods; yields the prefix
    that starts a command in each."""
    top, v1 = cgroup_top("cpuset", "cpuset", "cpuset.cpus")
    mems = open(os.path.join(top, "cpuset.mems")).read().strip() if v1 else None
    yield from cgroups(procs, top, "cpuset", [
        dict({"cpuset.cpus": str(cpu)}, **({"cpuset.mems": mems} if v1 else {}))
        for cpu in (0, 1)])


def cgroups(procs, top, name, settings):
    """One cgroup under @top for each of @settings (files to write); yields
    their prefixes, and takes them away once their processes are gone."""
    made = [os.path.join(top, "smclo-%s-%d-%d" % (name, os.getpid(), i))
            for i in range(len(settings))]
    try:
        yield [make_cgroup(path, files) for path, files in zip(made, settings)]
    finally:
        procs.stop_all()    # a cgroup goes once its processes have
        for path in made:
            if os.path.isdir(path):
                os.rmdir(path)


@needs_two_cpus
def test_cpusets_of_one_cpu_each_the_reader_spins(reg, procs, cpusets):
    rounds, switches, _ = ping_pong(reg, procs, cpusets[0], cpusets[1])
    assert rounds > 1000 and switches < rounds / 10, (rounds, switches)


@pytest.fixture
def quotas(procs):
    """Two cgroups under a quota of one CPU each (v1's cpu controller, else
    v2's cpu.max), as `--cpus=1` sets them; the prefixes that join them."""
    top, v1 = cgroup_top("cpu", "cpu", "cpu.cfs_quota_us")
    yield from cgroups(procs, top, "quota", [cpu_quota_files(v1)] * 2)


@needs_two_cpus
def test_under_a_quota_of_one_cpu_each_the_reader_spins(reg, procs, quotas):
    rounds, switches, _ = ping_pong(reg, procs, quotas[0], quotas[1])
    assert rounds > 1000 and switches < rounds / 10, (rounds, switches)
