"""A job across two emulated hosts (network namespaces joined by a veth pair).

Scheduler, servers and client groups sit in different namespaces and talk over
their interfaces, as on two machines; kvhybrid-launch reaches them with
``--launcher netns`` (``ip netns exec``).
"""
import json
import subprocess

import pytest

from tests.support.jobs import run_launcher
from tests.support.netns import TwoHosts, netns_available

pytestmark = pytest.mark.skipif(not netns_available(),
                                reason="needs root and Linux network namespaces (ip netns add)")


def test_job_across_two_namespace_hosts(tmp_path):
    with TwoHosts() as hosts:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{name} slots=2\n" for name in hosts.names))
        r = run_launcher(["-n", 4, "--clients", 2, "--servers", 2, "--launcher", "netns",
                          "--hostfile", hostfile], "lifecycle.py", ["ok"], timeout=180)
        assert r.returncode == 0, r.output[-4000:]
        for rank in range(4):
            assert f"worker rank {rank} done, sum 4" in r.output  # summed across both hosts
        # each process ran on its own host and advertised that host's address
        assert f"scheduler     {hosts.names[0]}" in r.output
        assert f"client 1      {hosts.names[1]}:2" in r.output
        assert f"started server 1 on {hosts.names[1]}" in r.output
        plan = run_launcher(["-n", 4, "--clients", 2, "--servers", 2, "--launcher", "netns",
                             "--hostfile", hostfile, "--dry-run"], "lifecycle.py", ["ok"])
        client1 = [line for line in plan.output.splitlines() if "client 1:" in line][0]
        assert f"DMLC_PS_ROOT_URI={hosts.addresses[0]}" in client1     # scheduler on host a
        assert f"DMLC_NODE_HOST={hosts.addresses[1]}" in client1       # master on host b
        assert f"ip netns exec {hosts.names[1]}" in client1


def test_a_group_spanning_emulated_hosts_over_shaped_links(tmp_path):
    """The benchmarks' emulated cluster: 2 hosts joined through a switch by 1 Gbit/s links.
    One client group spans both (mpirun reaches the second namespace like a remote host),
    with a server on each, and by default a row master on each; everything is gone
    afterwards."""
    from benchmarks.cluster import EmulatedCluster
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        hostfile = cluster.hostfile(tmp_path / "hosts", slots=2)
        r = run_launcher(["-n", 4, "--clients", 1, "--servers", 2, "--launcher", "netns",
                          "--hostfile", hostfile], "lifecycle.py", ["ok"], timeout=180)
        assert r.returncode == 0, r.output[-4000:]
        assert f"client 0      {cluster.names[0]}:2,{cluster.names[1]}:2" in r.output
        # --row-masters auto: the group spans hosts, so each host's first rank pushes rows
        assert "each host's first rank is a ps-lite worker (2 in all)" in r.output
        for rank in range(4):
            assert f"worker rank {rank} done, sum 4" in r.output
        names = cluster.names + [cluster.switch]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in left for name in names), left


def test_rows_aggregated_per_host_across_two_hosts_train_as_one_process(tmp_path):
    """--row-masters host on 2 emulated hosts: one group allreduces the dense keys over both,
    and each host's first rank (a ps-lite worker that finds its own host's address) pushes
    its host's rows of a SparseEmbedding; the weights equal single-process training."""
    from benchmarks.cluster import EmulatedCluster
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        hostfile = cluster.hostfile(tmp_path / "hosts", slots=2)
        r = run_launcher(["-n", 4, "--servers", 2, "--row-masters", "host", "--launcher",
                          "netns", "--hostfile", hostfile], "train_sparse.py",
                         [tmp_path, 1, STEPS, PER_DEVICE, "weight"], timeout=180)
        assert r.returncode == 0, r.output[-4000:]
    assert "each host's first rank is a ps-lite worker (2 in all)" in r.output
    # ranks 0 and 2 (each host's first) pushed rows to the servers, ranks 1 and 3 did not
    for rank, pushed in enumerate([True, False, True, False]):
        sent = json.load(open(tmp_path / f"weight-stats-rank{rank}.json"))["bytes_sent"]
        assert (sent["servers"] > 0) == pushed, (rank, sent)
    assert_matches_single_process(tmp_path, "weight", 4, 1)


def test_model_suite_one_command_loopback_and_emulated_hosts(tmp_path):
    """`python -m benchmarks.models --suite` (shortened to one round): loopback with an α
    point, 4 emulated hosts, 2 hosts × 2 workers at two rates; bytes counted on each host's
    link next to Table 3; every target listed."""
    import json
    import sys
    from tests.support.jobs import _run_killable
    cmd = [sys.executable, "-m", "benchmarks.models", "--suite", "--rounds", 1, "--models",
           "lm", "--steps", 8, "--warmup", 2, "--tokens", 10, "--alpha-tokens", 10, "--systems",
           "kvhybrid", "kvhybrid group-master", "dist_sync", "--out", tmp_path]
    r = _run_killable(list(map(str, cmd)), "the model suite", 800, {})
    assert r.returncode == 0, r.output[-4000:]
    net = json.loads((tmp_path / "models_1gbit.json").read_text())["lm"]
    # headers and ids add 3-6 %; over a few timed steps the window's edges may also cut off
    # part of a step that MXNet's engine still sends asynchronously (a CI run of 3 timed
    # steps counted 0.986x for dist_sync), hence the lower bound below 1
    for name in ("kvhybrid", "dist_sync"):   # (a master per host, the launcher's default)
        counted, table3 = net[name]["wire_per_host"], net[name]["table3_per_host"]
        assert 0.8 * table3 <= counted <= 1.2 * table3, (name, counted, table3)
    # the group's master carries every host's rows: more than per-host masters
    assert net["kvhybrid group-master"]["wire_per_host"] > 1.1 * net["kvhybrid"]["wire_per_host"]
    targets = (tmp_path / "models_targets.md").read_text()
    assert "lm kvhybrid ÷ dist_sync" in targets and "bytes per host ÷ Table 3" in targets
    assert "lm at 10 words per sample" in targets
    assert "4 emulated hosts at 1gbit" in targets and (tmp_path / "models_alpha.png").exists()
    assert "2 emulated hosts × 2 workers at 100mbit: lm kvhybrid ÷ dist_sync" in targets
    assert (tmp_path / "models_2x2_1gbit.md").exists() and "## Profiles of" in targets


def test_stopping_a_cluster_benchmark_leaves_no_process_and_no_host(tmp_path):
    """SIGTERM to the model benchmark mid-job: the running launcher stops its job, the
    emulated hosts are deleted, nothing of the job is left running."""
    import os
    import signal
    import sys
    import time
    from tests.support.jobs import ROOT, job_env
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.models", "--models", "lm",
                             "--systems", "kvhybrid", "--hosts", "2", "--workers", "2",
                             "--steps", "100000", "--out", str(tmp_path)],
                            cwd=ROOT, env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "model_worker" not in _processes(tmp_path):
            time.sleep(1)
        assert "model_worker" in _processes(tmp_path), "the benchmark never started its job"
        time.sleep(5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    time.sleep(2)
    assert _processes(tmp_path) == "", out[-3000:]
    hosts = f"kvc{proc.pid % 250}h"   # EmulatedCluster's names in that process
    assert hosts not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                       text=True).stdout


def test_a_clusters_hosts_are_emptied_before_they_are_deleted():
    """Processes left on an emulated host (as a host's orted and ranks are when a second
    SIGTERM cuts the launcher's grace short) are stopped when the cluster closes: SIGTERM,
    then SIGKILL for one that ignores it; none lives on in a deleted namespace."""
    from benchmarks.cluster import EmulatedCluster
    with EmulatedCluster(hosts=1, rate=None) as cluster:
        host = cluster.names[0]
        polite = subprocess.Popen(["ip", "netns", "exec", host, "sh", "-c",
                                   "echo ready; exec sleep 600"], stdout=subprocess.PIPE,
                                  text=True)
        stubborn = subprocess.Popen(["ip", "netns", "exec", host, "sh", "-c",
                                     "trap '' TERM; echo ready; sleep 600"],
                                    stdout=subprocess.PIPE, text=True)
        assert polite.stdout.readline() == "ready\n" == stubborn.stdout.readline()
    try:
        assert polite.wait(timeout=30) == -15
        assert stubborn.wait(timeout=30) == -9
    finally:
        for proc in (polite, stubborn):
            if proc.poll() is None:
                proc.kill()
    assert host not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout


def _processes(tmp_path) -> str:
    """The command lines of this test's job still running (they name its temporary folder
    or the benchmark's worker)."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return "\n".join(line for line in ps.splitlines()
                     if "benchmarks.model_worker" in line and "--steps 100000" in line)
