"""Whether a waiter spins depends on where its peer runs (spin.h): with
each end confined to a CPU of its own (taskset, a cpuset cgroup), a
ping-pong's reader watches its ring and sleeps almost never; with both
confined to one CPU it sleeps at every message (spinning there only keeps
the peer from running); under a CPU quota it spins as unconfined.

What is asserted is the reader's behaviour, not a speed: the client's
voluntary context switches (each sleep is one) against its round trips,
which the benchmark worker reports.  A reader that sleeps at every round
trip switches about once every one or two round trips; one that spins,
a small fraction of that."""
import os
import subprocess

import pytest

from conftest import SMCLO, cgroup_top, cpu_quota_files, free_port, make_cgroup, wait_port

SECONDS = "1"


def ping_pong(reg, procs, server_prefix=(), client_prefix=()):
    """The 100 B ping-pong of `make bench` for SECONDS, each end under its
    prefix; (round trips, the client's voluntary context switches)."""
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
    return rounds, ru.ru_nvcsw


def pinned(cpu):
    return ("taskset", "-c", str(cpu))


needs_two_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: nothing to place")


@needs_two_cpus
def test_pinned_to_different_cpus_the_reader_spins(reg, procs):
    rounds, switches = ping_pong(reg, procs, pinned(0), pinned(1))
    assert rounds > 1000 and switches < rounds / 10, (rounds, switches)


@needs_two_cpus
def test_pinned_to_one_cpu_the_reader_sleeps(reg, procs):
    rounds, switches = ping_pong(reg, procs, pinned(0), pinned(0))
    # a wake-up often lets the peer run before the reader gets to wait:
    # about one round trip in two sleeps; a spinning reader, almost none
    assert rounds > 1000 and switches >= rounds / 4, (rounds, switches)


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
    rounds, switches = ping_pong(reg, procs, cpusets[0], cpusets[1])
    assert rounds > 1000 and switches < rounds / 10, (rounds, switches)


@pytest.fixture
def quotas(procs):
    """Two cgroups under a quota of one CPU each (v1's cpu controller, else
    v2's cpu.max), as `--cpus=1` sets them; the prefixes that join them."""
    top, v1 = cgroup_top("cpu", "cpu", "cpu.cfs_quota_us")
    yield from cgroups(procs, top, "quota", [cpu_quota_files(v1)] * 2)


@needs_two_cpus
def test_under_a_quota_of_one_cpu_each_the_reader_spins(reg, procs, quotas):
    rounds, switches = ping_pong(reg, procs, quotas[0], quotas[1])
    assert rounds > 1000 and switches < rounds / 10, (rounds, switches)
