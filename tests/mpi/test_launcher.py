"""kvhybrid-launch: sizing, the commands it builds, its errors, and the lifecycle of real jobs
(scheduler, ps-lite servers and one mpirun per client group on this machine)."""
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.faultinject import descendants
from tests.support.jobs import ROOT, WORKERS, assert_printed_lines_whole, job_env, run_launcher

from kvhybrid.launch.hosts import Host, parse_hostfile
from kvhybrid.launch.mpirun import MpiJob, build_command
from kvhybrid.launch.sizing import JobSpec, SizingError, format_table, plan_job

LAUNCH = [sys.executable, "-m", "kvhybrid.launch.cli"]


def launch(*args, timeout=120):
    return subprocess.run(LAUNCH + list(map(str, args)), capture_output=True, text=True,
                          timeout=timeout, env=job_env(), cwd=ROOT)


# -- sizing ------------------------------------------------------------------------------------
def plan(n, clients=None, servers=None, hosts=(("localhost", 64),), **kw):
    return plan_job(JobSpec(n, clients, servers, tuple(Host(h, s) for h, s in hosts), **kw))


def test_sizing_splits_workers_into_equal_groups_and_places_them():
    p = plan(8, 2, 2, hosts=(("a", 4), ("b", 4)), launcher="ssh")
    assert (p.num_clients, p.num_servers, p.workers_per_client) == (2, 2, 4)
    assert p.scheduler_host == "a" and p.server_hosts == ["a", "b"]
    assert [c.ranks for c in p.clients] == [[("a", 4)], [("b", 4)]]
    table = format_table(p, {"scheduler": 9000})
    assert "8 workers = 2 client group(s) x 4 workers" in table
    assert "scheduler     a" in table and "port 9000" in table
    assert "client 1      b:4               4" in table


def test_sizing_groups_may_span_hosts():
    p = plan(6, 2, 1, hosts=(("a", 4), ("b", 2)), launcher="ssh")
    assert [c.ranks for c in p.clients] == [[("a", 3)], [("a", 1), ("b", 2)]]


def test_sizing_row_masters_per_host_makes_a_ps_lite_worker_of_each_host():
    p = plan(6, 1, 2, hosts=(("a", 4), ("b", 2)), launcher="ssh", row_masters="host")
    assert (p.num_clients, p.ps_workers) == (1, 2)
    assert "each host's first rank is a ps-lite worker (2 in all)" in format_table(p)
    emulated = plan(8, 1, 1, row_masters="host", emulate_node_size=2)   # 4 hosts of 2 ranks
    assert emulated.ps_workers == 4
    assert plan(4, 2, 2).ps_workers == 2                                # a master per group


def test_sizing_row_masters_auto_puts_a_master_on_each_host_a_group_spans():
    spanning = plan(6, 1, 2, hosts=(("a", 4), ("b", 2)), launcher="ssh")   # the default: auto
    assert (spanning.spec.row_masters, spanning.ps_workers) == ("host", 2)
    assert "each host's first rank is a ps-lite worker (2 in all)" in format_table(spanning)
    # one host, several groups, no servers, or a group that fits on its first host: one master
    for p in (plan(4, 1, 1), plan(8, 2, 2, hosts=(("a", 4), ("b", 4)), launcher="ssh"),
              plan(8, 1, 0, hosts=(("a", 4), ("b", 4)), launcher="ssh"),
              plan(4, 1, 1, hosts=(("a", 4), ("b", 4)), launcher="ssh"),
              plan(8, 1, 1, row_masters="group", hosts=(("a", 4), ("b", 4)), launcher="ssh")):
        assert (p.spec.row_masters, p.ps_workers) == ("group", p.num_clients), p.spec


def test_sizing_pure_mpi_and_auto():
    p = plan(4)
    assert (p.num_clients, p.num_servers, p.scheduler_host) == (1, 0, None)
    assert "pure MPI" in format_table(p)
    hosts = (("a", 2), ("b", 2))
    dense = plan(4, hosts=hosts, launcher="ssh", auto=True)
    assert (dense.num_clients, dense.num_servers) == (1, 0)      # dense model: no servers
    sparse = plan(4, hosts=hosts, launcher="ssh", auto=True, sparse=True)
    assert (sparse.num_clients, sparse.num_servers) == (2, 2)    # a server and a group per host


@pytest.mark.parametrize("kwargs,message", [
    (dict(n=4, clients=3, servers=1), "use --clients one of 1, 2, 4"),
    (dict(n=2, clients=3, servers=1), "--clients 3 is more than the 2 workers"),
    (dict(n=4, clients=2, servers=0), "--clients 2 needs --servers >= 1"),
    (dict(n=4, clients=2, servers=2, hosts=(("far-away", 4),)), "--launcher local cannot reach it"),
    (dict(n=8, clients=2, servers=1, hosts=(("a", 2), ("b", 2)), launcher="ssh"), "4 slots for 8"),
])
def test_sizing_errors_say_what_would_work(kwargs, message):
    with pytest.raises(SizingError, match="") as err:
        plan(**kwargs)
    assert message in str(err.value)


def test_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# two hosts\nnode1 slots=4\nnode2:2\n")
    assert parse_hostfile(str(f)) == [Host("node1", 4), Host("node2", 2)]


# -- commands ----------------------------------------------------------------------------------
def test_openmpi_command_forwards_settings_and_oversubscribes():
    cmd = build_command(MpiJob(64, ["python", "train.py"]), "mpirun", "openmpi",
                        {"KVHYBRID_TIMEOUT": "9", "HOME": "/root", "DMLC_ROLE": "worker",
                         "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert cmd[:3] == ["mpirun", "-np", "64"]
    assert "--oversubscribe" in cmd and "--tag-output" in cmd
    for var in ("KVHYBRID_TIMEOUT", "DMLC_ROLE", "GLIBC_TUNABLES"):
        assert cmd[cmd.index(var) - 1] == "-x"
    assert "HOME" not in cmd
    assert cmd[-2:] == ["python", "train.py"]


def test_mpich_command_uses_hosts_and_genvlist():
    cmd = build_command(MpiJob(4, ["python", "t.py"], hosts="a:2,b:2"), "mpiexec", "mpich",
                        {"KVHYBRID_TIMEOUT": "9"})
    assert cmd[cmd.index("-hosts") + 1] == "a:2,b:2"
    assert cmd[cmd.index("-genvlist") + 1] == "KVHYBRID_TIMEOUT"


def test_dry_run_prints_table_and_the_commands_to_run_by_hand():
    r = launch("-n", 4, "--clients", 2, "--servers", 2, "--dry-run", "python", "examples/train_mlp.py")
    assert r.returncode == 0, r.stderr
    assert "2 client group(s) + 2 parameter server(s)" in r.stdout
    assert "DMLC_ROLE=scheduler" in r.stdout and "DMLC_ROLE=server" in r.stdout
    assert r.stdout.count("DMLC_ROLE=worker") == 2 and "DMLC_NUM_WORKER=2" in r.stdout
    assert "KVHYBRID_CLIENT_ID=1" in r.stdout and "mpirun -np 2" in r.stdout


def test_omp_threads_share_the_host_among_workers_and_servers_unless_the_user_sets_them():
    env = job_env()
    env.pop("OMP_NUM_THREADS", None)
    args = LAUNCH + ["-n", "4", "--clients", "1", "--servers", "1", "--dry-run", "python",
                     "examples/train_mlp.py"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    share = max(1, (os.cpu_count() or 1) // 5)   # 4 workers and a server on this host
    commands = r.stdout.split("commands (the same job by hand)")[1]
    assert re.findall(r"OMP_NUM_THREADS=(\d+)", commands) == [str(share)] * 2   # server, client
    assert "-x OMP_NUM_THREADS" in r.stdout   # mpirun hands it to every rank
    assert f"operator threads: OMP_NUM_THREADS={share} per worker and server" in r.stdout
    env["OMP_NUM_THREADS"] = "3"
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert set(re.findall(r"OMP_NUM_THREADS=(\d+)", r.stdout)) == {"3"}
    assert "operator threads" not in r.stdout   # the user's own choice needs no line


def test_emulated_hosts_share_this_machines_cores_among_all_their_processes():
    env = job_env()
    env.pop("OMP_NUM_THREADS", None)
    cores = os.cpu_count() or 1   # each host as many ranks as cores: only together crowded
    args = LAUNCH + ["-n", str(2 * cores), "-H", f"nsa:{cores},nsb:{cores}", "--launcher", "netns",
                     "--dry-run", "python", "examples/train_mlp.py"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "--mca mpi_yield_when_idle 1" in r.stdout   # waiting ranks yield the shared cores
    assert ("operator threads: OMP_NUM_THREADS=1 per worker and server (emulated hosts on "
            f"this machine: {cores} cores ÷ {2 * cores} processes)") in r.stdout


def test_interface_names_the_address_processes_advertise():
    r = launch("-n", 2, "--clients", 2, "--servers", 1, "--interface", "lo", "--dry-run",
               "python", "examples/train_mlp.py")
    assert r.returncode == 0, r.stderr
    assert "DMLC_INTERFACE=lo" in r.stdout and "DMLC_NODE_HOST=127.0.0.1" in r.stdout
    bad = launch("-n", 2, "--clients", 2, "--servers", 1, "--interface", "nosuchif0",
                 "python", "examples/train_mlp.py")
    assert bad.returncode == 2 and "no IPv4 address on nosuchif0" in bad.stderr


# -- bad input: one line, exit code 2, nothing started ------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["-n", 4, "--clients", 3, "--servers", 1], "use --clients one of 1, 2, 4"),
    (["-n", 2, "--clients", 4, "--servers", 1], "more than the 2 workers"),
    (["-n", 4, "--clients", 2, "--servers", 2, "-H", "unreachable-host:4"], "use --launcher ssh"),
    (["-n", 2, "--launcher", "carrier-pigeon"], "invalid choice: 'carrier-pigeon'"),
    (["-n", 2, "--launcher", "slurm"], "SLURM_JOB_NODELIST is not set"),
    (["-n", 0], "-n must be at least 1"),
    (["-n", 4, "--clients", 2, "--servers", 1, "--row-masters", "host"], "use it with --clients 1"),
    (["-n", 4, "--row-masters", "host"], "--servers >= 1"),
])
def test_bad_input_exits_2_with_one_line_and_starts_nothing(args, message):
    r = launch(*args, "python", "examples/train_mlp.py")
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert len([line for line in r.stderr.splitlines() if "error" in line]) == 1
    assert "started" not in r.stderr and r.stdout == ""


def test_bad_emulated_host_size_exits_2_naming_the_variable():
    r = subprocess.run(LAUNCH + ["-n", "4", "--servers", "1", "--row-masters", "host", "python",
                                 "examples/train_mlp.py"], capture_output=True, text=True,
                       timeout=120, env=job_env({"KVHYBRID_EMULATE_NODE_SIZE": "two"}), cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "KVHYBRID_EMULATE_NODE_SIZE='two'" in r.stderr and "started" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["-n", 2, "python", "no/such/script.py"], "script 'no/such/script.py' not found"),
    (["-n", 2], "missing the command to run"),
    (["-n", 2, "--hostfile", "/no/such/hostfile", "python", "examples/train_mlp.py"], "no such file"),
])
def test_bad_command_line_exits_2(args, message):
    r = launch(*args)
    assert r.returncode == 2 and message in r.stderr and "started" not in r.stderr


# -- real jobs ---------------------------------------------------------------------------------
def test_pure_mpi_job():
    r = run_launcher(["-n", 3], "lifecycle.py", ["ok"], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    for rank in range(3):
        assert f"worker rank {rank} done, sum 3" in r.output


def test_groups_and_servers_job():
    r = run_launcher(["-n", 4, "--clients", 2, "--servers", 2], "lifecycle.py", ["ok"], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    assert "[scheduler]" not in r.output or "error" not in r.output.lower()
    for rank in range(4):
        assert f"worker rank {rank} done, sum 4" in r.output   # summed over both groups
    assert "the job finished" in r.output


_RUNNING: list = []


@pytest.fixture(autouse=True)
def _no_job_left_behind():
    """Whatever a test asserted, kill what its background jobs left running."""
    yield
    while _RUNNING:
        _RUNNING.pop().kill_all()


class Running:
    """A launcher job in the background, with every process it started, by PID."""

    def __init__(self, *args):
        cmd = LAUNCH + list(map(str, args))
        # Started as a shell starts a background command: with SIGINT ignored. Ctrl-C must
        # still stop the job (the launcher sets its own handlers).
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=job_env(), cwd=ROOT,
                                      preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                       signal.SIG_IGN))
        self.pids = set()
        _RUNNING.append(self)

    def kill_all(self) -> None:
        self._collect()
        for pid in self.pids | {self.popen.pid}:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        self.popen.wait()

    def wait_until_ready(self, workers: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._collect()
            if self._ready(workers):
                return
            time.sleep(0.2)
        raise AssertionError("the job did not start in time")

    def _ready(self, workers: int) -> bool:
        procs = [psutil.Process(p) for p in self.pids if psutil.pid_exists(p)]
        return sum(1 for p in procs if "lifecycle.py" in " ".join(p.cmdline()) and
                   "python" in p.name()) >= workers

    def _collect(self) -> None:
        self.pids |= descendants(self.popen.pid)

    def find(self, role: str) -> psutil.Process:
        for pid in self.pids:
            try:
                p = psutil.Process(pid)
                if p.environ().get("DMLC_ROLE") == role and "kvhybrid.kvstore.ps.node" in p.cmdline():
                    return p
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"no {role} process found")

    def finish(self, timeout: float):
        start = time.monotonic()
        try:
            out, _ = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:   # leave nothing behind for the next tests
            self.kill_all()
            out, _ = self.popen.communicate()
            raise AssertionError(f"the launcher still ran after {timeout} s (killed it and "
                                 f"its processes):\n{out[-3000:]}") from None
        return self.popen.returncode, out, time.monotonic() - start

    def leftovers(self):
        time.sleep(0.5)
        return [p for p in self.pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def start_hybrid_job(*worker_args) -> Running:
    """4 workers in 2 client groups with 2 servers, running tests/mpi/workers/lifecycle.py."""
    job = Running("-n", 4, "--clients", 2, "--servers", 2, "python", WORKERS / "lifecycle.py",
                  *worker_args)
    job.wait_until_ready(4)
    return job


def test_failing_worker_stops_the_job_within_10_s_naming_it():
    job = start_hybrid_job("raise", 3)
    rc, out, _ = job.finish(timeout=60)
    stopped = time.time()
    assert rc != 0
    failed = re.search(r"worker 3 failed on purpose at (\d+\.\d+)", out)
    assert failed, out[-3000:]
    assert "exited with code" in out and "stopping the job" in out   # the launcher names it
    assert "client " in out.split("stopping the job")[0].splitlines()[-1]
    # from the failure, not from the processes' start (imports and set-up vary with load)
    seconds = stopped - float(failed.group(1))
    assert seconds < 10, f"took {seconds:.1f} s after the failure"
    assert job.leftovers() == []


def test_killed_server_stops_the_job_within_10_s_naming_it():
    job = start_hybrid_job("train")
    time.sleep(1)
    server = job.find("server")
    server.kill()
    rc, out, seconds = job.finish(timeout=60)
    assert rc != 0
    assert "server " in out and "was killed by signal 9" in out
    assert seconds < 10, f"took {seconds:.1f} s"
    assert job.leftovers() == []


@pytest.mark.parametrize("sig,rc,said", [(signal.SIGINT, 130, "interrupted"),
                                         (signal.SIGTERM, 143, "terminated (SIGTERM)")],
                         ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_everything(sig, rc, said):
    job = start_hybrid_job("train")
    job.popen.send_signal(sig)
    got, out, seconds = job.finish(timeout=60)
    assert got == rc, out[-2000:]
    assert f"{said}: stopping every process of the job" in out
    assert seconds < 10
    assert job.leftovers() == []


def test_openmpi_allreduce_tuning_is_on_by_default_and_yields_to_the_user():
    from kvhybrid.launch.mpirun import ALLREDUCE_RULES
    cmd = build_command(MpiJob(2, ["python", "t.py"]), "mpirun", "openmpi", {})
    assert cmd[cmd.index("coll_tuned_dynamic_rules_filename") + 1] == str(ALLREDUCE_RULES)
    assert ALLREDUCE_RULES.is_file()
    # the user's own coll_tuned settings, in the environment or in --mpi-args, win
    for env, extra in (({"OMPI_MCA_coll_tuned_use_dynamic_rules": "0"}, []),
                       ({}, ["--mca", "coll_tuned_allreduce_algorithm", "3"])):
        cmd = build_command(MpiJob(2, ["python", "t.py"], extra_args=extra), "mpirun", "openmpi", env)
        assert "coll_tuned_dynamic_rules_filename" not in cmd
    cmd = build_command(MpiJob(2, ["python", "t.py"], tune_mpi=False), "mpirun", "openmpi", {})
    assert "coll_tuned_dynamic_rules_filename" not in cmd


def test_no_mpi_tuning_flag_reaches_the_commands():
    on = launch("-n", 2, "--dry-run", "python", "examples/train_mlp.py")
    off = launch("-n", 2, "--no-mpi-tuning", "--dry-run", "python", "examples/train_mlp.py")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert "ompi_allreduce_rules.conf" in on.stdout
    assert "ompi_allreduce_rules.conf" not in off.stdout


def test_scheduler_port_taken_before_it_binds_means_another_port(monkeypatch, caplog):
    """The port is probed free, then bound by the scheduler seconds later (after MXNet's
    import): whoever takes it between those must cost a retry, not the job (CI saw
    ps-lite's 'bind failed' end a job once in 334 tests)."""
    import socket

    from kvhybrid.launch import cli
    from kvhybrid.launch.supervisor import Supervisor, _kill_group
    from kvhybrid.launch.transport import free_port

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    ports = iter([taken])
    monkeypatch.setattr(cli, "free_port", lambda t, h: next(ports, None) or free_port(t, h))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    job = cli.Job(plan(2, clients=1, servers=1), ["python", "t.py"], [])
    sup = Supervisor()
    try:
        with caplog.at_level("WARNING", logger="kvhybrid.launch"):
            assert job._start_scheduler(sup)
        assert job.port != taken
        assert f"exited before opening port {taken} (attempt 1 of 3)" in caplog.text
        scheduler, = sup.procs
        assert cli.listening(scheduler.popen.pid, "local", "127.0.0.1", job.port)
    finally:
        squatter.close()
        for proc in sup.procs:
            _kill_group(proc.popen.pid)


def test_a_ranks_unbuffered_print_of_several_pieces_arrives_as_one_line():
    # mpirun --tag-output tags each write, and PYTHONUNBUFFERED=1 (the jobs' environment)
    # writes each argument of print() on its own, between the other rank's pieces
    r = run_launcher(["-n", "2"], "print_lines.py", timeout=60, env={"PYTHONUNBUFFERED": "1"})
    assert_printed_lines_whole(r, "[1,{rank}]<stdout>:")
    tagged = [line for line in r.output.splitlines() if "<stdout>:" in line]
    assert all(line.count("<stdout>:") == 1 for line in tagged), tagged
