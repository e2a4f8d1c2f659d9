"""``kvhybrid-launch``: start a kvhybrid job — scheduler, servers and one mpirun per client group.

    kvhybrid-launch -n 4 python train.py                           # pure MPI: one mpirun
    kvhybrid-launch -n 4 --clients 2 --servers 2 python train.py   # 2 groups of 2 + 2 servers
    kvhybrid-launch -n 8 --clients 2 --servers 2 --hostfile hosts --launcher ssh python train.py
    kvhybrid-launch --clients 2 --servers 2 --launcher slurm python train.py   # in salloc/sbatch
    kvhybrid-launch -n 4 --tune python train.py    # try a few shapes, run in the fastest

Prints the sizing table before starting anything, prefixes every output line
with the process it came from, stops the whole job within seconds when any
process fails (naming it, with the tail of its output) or on Ctrl-C, and exits
with the job's exit code. Bad arguments exit with code 2 and start nothing.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from . import shape_tune, slurm, tune
from .hosts import HostError, local_hosts, parse_host_list, parse_hostfile
from .mpirun import (DEFAULT_ENV, MpiImplementation, MpiJob, MpiUnsupported, build_command,
                     check_supported, find_mpirun, implementation, job_env, output_tag,
                     runtime_setting)
from .sizing import JobPlan, JobSpec, SizingError, format_table, plan_job
from .supervisor import Supervisor, Terminated, signals_interrupt
from .transport import (TRANSPORTS, address, check_ssh, free_port, hand_secret, listening,
                        take_back_secret, wrap)
from kvhybrid.kvstore.ps.auth import SECRET_FILE_VAR, SECRET_VAR, new_secret

log = logging.getLogger("kvhybrid.launch")

SCHEDULER_TRIES = 3
#: seconds to wait for the scheduler to bind its port before starting the rest anyway
SCHEDULER_BIND_WAIT = 60
#: seconds without a heartbeat after which ps-lite's scheduler declares a node dead
HEARTBEAT_TIMEOUT = 3


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kvhybrid-launch", description=__doc__.split("\n\n")[0],
        epilog="Set for every process unless already set: "
               + ", ".join(f"{k}={v}" for k, v in DEFAULT_ENV.items())
               + ", and OMP_NUM_THREADS=the host's cores / its workers and servers (at least "
                 "1), as torchrun does")
    p.add_argument("-n", "--num-workers", type=int, metavar="N",
                   help="number of worker processes (MPI ranks, all client groups together); "
                        "with --launcher slurm, default: the allocation's tasks")
    p.add_argument("--clients", type=int, help="client groups (default 1; with --auto: hosts)")
    p.add_argument("-s", "--servers", type=int,
                   help="parameter servers (default 0 = pure MPI; with --auto: hosts if --sparse)")
    p.add_argument("--auto", action="store_true",
                   help="size like Parallax: a server per host for sparse models, none for dense; "
                        "a client group per host")
    p.add_argument("--sparse", action="store_true", help="the model has row_sparse keys (--auto)")
    p.add_argument("--row-masters", choices=("auto", "group", "host"), default="auto",
                   help="who aggregates row_sparse gradients for the servers: the group's master, "
                        "or each host's first rank for its host (one client group; dense keys "
                        "stay allreduced over the group); auto (default): host when the one "
                        "client group spans several hosts and there are servers, else group")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. node1:4,node2:4 (default: this machine)")
    p.add_argument("--hostfile", help="an MPI hostfile ('host slots=N' lines)")
    p.add_argument("--launcher", default="local", choices=TRANSPORTS,
                   help="how processes reach their hosts: local, ssh (password-less ssh to each "
                        "host, a file system shared by all), slurm (inside salloc/sbatch: the "
                        "allocation's nodes and tasks unless -H is given, processes started "
                        "with srun), or netns (host names are network namespaces on this "
                        "machine)")
    p.add_argument("--interface", metavar="IF",
                   help="network interface the scheduler, servers and masters advertise, "
                        "listen on and connect over (default: loopback for a local run, else "
                        "the host's address; docs/security.md lists what listens where)")
    p.add_argument("--mpi-args", default="", help="extra arguments for each mpirun, quoted")
    p.add_argument("--no-mpi-tuning", action="store_true",
                   help="leave Open MPI's allreduce at its defaults (by default the launcher "
                        "hands it launch/ompi_allreduce_rules.conf: the segmented ring from 8 MB)")
    p.add_argument("--tune-partitions", action="store_true",
                   help="run the job a few times at different KVHYBRID_PARTITIONS, fit Parallax's "
                        "model, remember the best for this job (later runs start with it)")
    p.add_argument("--tune", action="store_true",
                   help="run short trials of the job in a few shapes (client groups, "
                        "servers, row masters; then the partition count), run it in the "
                        "fastest and remember it for this job (later runs start there)")
    p.add_argument("--tune-budget", type=float, metavar="SECONDS",
                   help=f"seconds --tune may spend on trials (default "
                        f"{shape_tune.DEFAULT_BUDGET:.0f}); no trial starts that would exceed it")
    p.add_argument("--tune-samples", type=int, default=5, metavar="K",
                   help="at most K settings sampled by --tune-partitions (default 5, at least 3)")
    p.add_argument("--tune-out", metavar="DIR",
                   help="write partitions_tuning.{md,png} (samples and fitted curve) into DIR")
    p.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="restart a client group that fails (N=1: once per job, all ps-lite allows) while the other "
                        "groups train on (asynchronous and elastic stores, which need servers; a "
                        "synchronous job cannot go on without a group). Default 0: any failure "
                        "stops the job")
    p.add_argument("--dry-run", action="store_true", help="print the table and commands, start nothing")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")
    args = p.parse_args(argv)
    if args.num_workers is None and args.launcher != "slurm":
        p.error("the following arguments are required: -n/--num-workers")
    if args.hosts and args.hostfile:
        p.error("give either -H/--hosts or --hostfile, not both")
    if args.hostfile and not os.path.isfile(args.hostfile):
        p.error(f"--hostfile {args.hostfile}: no such file")
    if not args.command:
        p.error("missing the command to run, e.g. kvhybrid-launch -n 4 python train.py")
    if args.restarts not in (0, 1):
        p.error(f"--restarts must be 0 or 1, got {args.restarts}: ps-lite (MXNet 1.9.1) takes "
                "back one restarted node per job, its scheduler aborts at a second")
    if args.tune_samples < 3:
        p.error(f"--tune-samples must be at least 3 (the fit has 3 parameters), got "
                f"{args.tune_samples}")
    check_tune_flags(p, args)
    if shutil.which(args.command[0]) is None and not os.path.isfile(args.command[0]):
        p.error(f"command {args.command[0]!r} not found")
    scripts = [c for c in args.command[1:2] if c.endswith(".py")]
    if scripts and not os.path.isfile(scripts[0]):
        p.error(f"script {scripts[0]!r} not found")
    return args


def check_tune_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--tune chooses the shape itself: flags that fix it, or that start nothing, are refused."""
    if args.tune_budget is not None and not args.tune:
        p.error("--tune-budget bounds the trials of --tune: add --tune, or drop --tune-budget")
    if not args.tune:
        return
    fixed = [flag for flag, given in (("--clients", args.clients is not None),
                                      ("--servers", args.servers is not None),
                                      ("--auto", args.auto), ("--sparse", args.sparse),
                                      ("--row-masters", args.row_masters != "auto")) if given]
    if fixed:
        p.error(f"--tune chooses the client groups, servers and row masters itself: drop "
                f"{', '.join(fixed)}, or drop --tune to run that shape")
    if args.tune_partitions:
        p.error("--tune searches the partition count for the shape it picks: drop "
                "--tune-partitions")
    if args.dry_run:
        p.error("--tune runs trial jobs and --dry-run starts nothing: drop one of them (a dry "
                "run shows the shape an earlier --tune remembered)")
    if args.restarts:
        p.error("--tune's trials include pure MPI, which --restarts cannot restart: give the "
                "shape with --clients and --servers to use --restarts, or drop --restarts")
    if args.tune_budget is None:
        args.tune_budget = shape_tune.DEFAULT_BUDGET
    if args.tune_budget <= 0:
        p.error(f"--tune-budget must be more than 0 seconds, got {args.tune_budget:g}")


def job_hosts(args) -> list:
    """The hosts the job may use (and, under Slurm without -n, the workers)."""
    if args.hosts:
        hosts = parse_host_list(args.hosts)
    elif args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    elif args.launcher == "slurm":
        hosts = slurm.allocation_hosts(os.environ)
    else:
        hosts = local_hosts(args.num_workers)
    if args.launcher == "slurm":
        slurm.find_srun()
        if args.hosts or args.hostfile:
            slurm.check_hosts_in_allocation(hosts, os.environ)
        if args.num_workers is None:
            args.num_workers = sum(h.slots for h in hosts)
    return hosts


def make_plan(args, hosts=None) -> JobPlan:
    hosts = job_hosts(args) if hosts is None else hosts
    # the store's own parser: a bad value is refused here, naming the variable, not in every rank
    from kvhybrid.config import StoreConfig
    emulate = StoreConfig.from_env({"KVHYBRID_EMULATE_NODE_SIZE": os.environ.get(
        "KVHYBRID_EMULATE_NODE_SIZE", "")}).emulate_node_size
    return plan_job(JobSpec(args.num_workers, args.clients, args.servers, tuple(hosts),
                            args.launcher, args.auto, args.sparse, args.row_masters, emulate))


NETNS_RSH = Path(__file__).resolve().parent / "netns_rsh.sh"


def netns_mpi_args(mpi: MpiImplementation) -> List[str]:
    """Open MPI settings for a group spanning namespace hosts: mpirun reaches the other
    namespaces through ``netns_rsh.sh`` (as it would through ssh), and ranks talk over the
    hosts' interfaces, never loopback (which would bypass the emulated links), and with no
    UCX for one-sided calls (see ``one_machine_mpi_args``)."""
    return [*runtime_setting(mpi, "plm_rsh_agent", str(NETNS_RSH)),
            "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_exclude", "lo",
            *runtime_setting(mpi, "oob_tcp_if_exclude", "lo"), "--mca", "osc", "^ucx"]


def one_machine_mpi_args(mpi_args: List[str], env: Dict[str, str]) -> List[str]:
    """Open MPI settings for a group whose ranks all run on this machine: shared memory only
    (``ob1`` with the ``self`` and ``vader`` transports), so no rank listens on a TCP port
    (by default each does, on every interface), and no UCX for one-sided calls (Open MPI 5's
    asks for UCX's pml, and prints an error in every rank when it is not the one chosen).
    Left out when the user chose a pml or btl (osc: that one)."""
    if any(a in ("pml", "btl") for a in mpi_args) or "OMPI_MCA_pml" in env \
            or "OMPI_MCA_btl" in env:
        return []
    osc = [] if "osc" in mpi_args or "OMPI_MCA_osc" in env else ["--mca", "osc", "^ucx"]
    return ["--mca", "pml", "ob1", "--mca", "btl", "self,vader", *osc]


def own_host_mpi_args(mpi: MpiImplementation, mpi_args: List[str],
                      env: Dict[str, str]) -> List[str]:
    """Open MPI settings for a group whose ranks all run on mpirun's own host: its
    ``isolated`` launcher, which starts them without a remote shell. Open MPI 4 otherwise
    ends at once on a machine without ssh or rsh ("plm_rsh_agent: ssh : rsh ... could not
    be found"), even for ranks it would never start remotely. Left out when the user
    chose a launcher (any ``plm`` setting), and for Open MPI 5, whose PRRTE has no such
    launcher and looks for ssh only when it starts a daemon on another host."""
    if mpi.prrte or any("plm" in a for a in mpi_args) \
            or any(k.startswith("OMPI_MCA_plm") for k in env):
        return []
    return ["--mca", "plm", "isolated"]


def check_transport(mpi: MpiImplementation, mpirun: str, plan: JobPlan) -> None:
    """Refuse the pairs of MPI and transport the suite does not run: Hydra (MPICH's and
    Intel MPI's mpirun) is tested on one machine and over ssh; across namespaces its
    proxies have no agent, and under Slurm it starts them with srun, untested
    (tests/mpi/test_mpich.py, test_intel_mpi.py, test_ssh.py)."""
    if mpi.kind == "openmpi":
        return
    transport = plan.spec.launcher
    if transport == "netns" and any(len(c.ranks) > 1 for c in plan.clients):
        raise MpiUnsupported(
            f"{mpirun} is {mpi}: --launcher netns runs a client group across namespaces "
            "with Open MPI's rsh agent only; give each group one host (--clients = the "
            "hosts' count) or put Open MPI's mpirun first on PATH")
    if transport == "slurm":
        raise MpiUnsupported(
            f"{mpirun} is {mpi}: --launcher slurm is tested with Open MPI (4 and 5) only; put "
            "Open MPI's mpirun first on PATH, or reach the nodes with --launcher ssh")


class Job:
    """The processes of one planned job and how to start them."""

    def __init__(self, plan: JobPlan, command: List[str], mpi_args: List[str],
                 interface: Optional[str] = None, tune_mpi: bool = True, restarts: int = 0):
        self.plan = plan
        self.restarts = restarts
        self.transport = plan.spec.launcher
        self.command = list(command)
        if self.command[0] in ("python", "python3"):
            self.command[0] = sys.executable  # the launcher's interpreter and virtual environment
        self.mpi_args = mpi_args
        self.tune_mpi = tune_mpi
        self.mpirun = find_mpirun()
        mpi = implementation(self.mpirun)
        check_supported(mpi, self.mpirun)
        check_transport(mpi, self.mpirun, plan)
        self.mpi = mpi
        self.base_env = job_env({})
        if plan.num_servers:
            # the servers unpickle only commands signed with it (kvstore/ps/auth.py); it travels
            # in environments and files, never on a command line. A user's own is kept.
            self.base_env.pop(SECRET_FILE_VAR, None)
            self.base_env[SECRET_VAR] = os.environ.get(SECRET_VAR) or new_secret()
        #: host -> the file holding the secret there (ssh: a remote env has no other way in)
        self.secret_files: Dict[str, str] = {}
        hosts = {h.name for h in plan.spec.hosts}
        self.interface = interface
        self.addresses = ({h: address(self.transport, h, interface) for h in hosts}
                          if plan.num_servers else {})
        self.port: Optional[int] = None
        self.tmpdir = tempfile.mkdtemp(prefix="kvhybrid-launch-")  # last: nothing can fail after

    def dmlc_env(self, role: str, host: str) -> Dict[str, str]:
        if not self.plan.num_servers:
            return {}
        env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": self.addresses[self.plan.scheduler_host],
               "DMLC_PS_ROOT_PORT": str(self.port), "DMLC_NUM_SERVER": str(self.plan.num_servers),
               "DMLC_NUM_WORKER": str(self.plan.ps_workers),
               "DMLC_NODE_HOST": self.addresses[host],
               "PS_VERBOSE": self.base_env.get("PS_VERBOSE", "0")}
        if role == "worker" and self.plan.spec.row_masters == "host":
            env["KVHYBRID_ROW_MASTERS"] = "host"
            if self.plan.clients[0].spans_hosts:
                # one mpirun reaches every host, so one address cannot fit every master:
                # each finds its own (DMLC_INTERFACE, --interface, or its first non-loopback)
                del env["DMLC_NODE_HOST"]
        if self.interface:
            env["DMLC_INTERFACE"] = self.interface
        if self.restarts:
            # ps-lite gives a restarted node its old place only once the scheduler has
            # declared it dead: every node beats each second, and the scheduler declares a
            # node dead after HEARTBEAT_TIMEOUT s without a beat (< supervisor.RESTART_DELAY)
            env["PS_HEARTBEAT_INTERVAL"] = "1"
            if role == "scheduler":
                env["PS_HEARTBEAT_TIMEOUT"] = str(HEARTBEAT_TIMEOUT)
        return env

    def _shares_cores(self, other: str, host: str) -> bool:
        """Whether processes on ``other`` run on ``host``'s cores: the same host, or any two
        emulated hosts (network namespaces of this one machine)."""
        return other == host or self.transport == "netns"

    def _procs(self, host: str) -> int:
        """Workers and servers on ``host``'s cores (the scheduler only waits)."""
        plan, same = self.plan, self._shares_cores
        return sum(k for c in plan.clients for h, k in c.ranks if same(h, host)) \
            + sum(same(h, host) for h in plan.server_hosts)

    def _omp_threads(self, host: str) -> int:
        """``host``'s cores shared among its workers and servers, at least 1 (hosts alike
        assumed, as ``_crowded``)."""
        return max(1, (os.cpu_count() or 1) // max(1, self._procs(host)))

    def omp_env(self, hosts) -> Dict[str, str]:
        """OMP_NUM_THREADS for processes on ``hosts`` (the least of their shares), unless the
        user set it. MXNet's operators otherwise start a thread per core in every process,
        whose waits spin (docs/configuration.md has the figures)."""
        if "OMP_NUM_THREADS" in self.base_env:
            return {}
        return {"OMP_NUM_THREADS": str(min(self._omp_threads(h) for h in hosts))}

    def omp_summary(self) -> Optional[str]:
        """The line under the sizing table that says what ``omp_env`` chose, and how to
        choose otherwise (None when the user set it)."""
        if "OMP_NUM_THREADS" in self.base_env:
            return None
        plan = self.plan
        hosts = sorted({h for c in plan.clients for h, _ in c.ranks} | set(plan.server_hosts))
        cores = os.cpu_count() or 1
        shares = (f"emulated hosts on this machine: {cores} cores ÷ {self._procs(hosts[0])} "
                  "processes" if self.transport == "netns" else
                  ", ".join(f"{h}: {cores} cores ÷ {self._procs(h)} processes" for h in hosts))
        return (f"operator threads: OMP_NUM_THREADS={min(map(self._omp_threads, hosts))} per "
                f"worker and server ({shares}); set OMP_NUM_THREADS to choose")

    def _ps_node(self, role: str, host: str):
        env = self.dmlc_env(role, host)
        if role == "server":
            env.update(self.omp_env([host]))
        if host in self.secret_files:
            env[SECRET_FILE_VAR] = self.secret_files[host]
        # MXNet's loop, but commands are unpickled only when signed with the job's secret
        cmd = [sys.executable, "-m", "kvhybrid.kvstore.ps.node"]
        return wrap(self.transport, host, cmd, env, self.base_env), {**self.base_env, **env}

    def client(self, c):
        env = {**self.dmlc_env("worker", c.master_host), "KVHYBRID_CLIENT_ID": str(c.client),
               **self.omp_env({h for h, _ in c.ranks})}
        full = {**self.base_env, **env}
        hosts = None
        if self.transport in ("ssh", "slurm") \
                or (self.transport == "local" and len(self.plan.spec.hosts) > 1) \
                or (self.transport == "netns" and len(c.ranks) > 1):
            hosts = ",".join(f"{h}:{k}" for h, k in c.ranks)
        extra = list(self.mpi_args)
        if self.transport == "netns" and len(c.ranks) > 1 and self.mpi.kind == "openmpi":
            extra = netns_mpi_args(self.mpi) + extra
        if self.transport == "local" and len(self.plan.spec.hosts) == 1 \
                and self.mpi.kind == "openmpi":
            extra = one_machine_mpi_args(self.mpi_args, self.base_env) + extra
        if hosts is None and self.transport in ("local", "netns") \
                and self.mpi.kind == "openmpi":
            extra = own_host_mpi_args(self.mpi, self.mpi_args, self.base_env) + extra
        if self.transport == "slurm":
            extra = slurm.mpirun_args(self.mpi) + extra
        if self.mpi.kind == "openmpi" and len(self.plan.clients) > 1:
            # mpiruns started together race to create the same session directory in /tmp
            # ("mkdir ... File exists"): give each group its own.
            extra = runtime_setting(self.mpi, "orte_tmpdir_base",
                                    os.path.join(self.tmpdir, f"client{c.client}")) + extra
        hostfile = None
        if hosts is not None and self.mpi.kind == "intel":
            # Intel MPI's -hosts takes names only ("a:2" would be a host of that name); its
            # machine file takes each host's count
            hostfile = os.path.join(self.tmpdir, f"client{c.client}.hosts")
            with open(hostfile, "w") as f:
                f.writelines(f"{h}:{k}\n" for h, k in c.ranks)
            hosts = None
        cmd = build_command(MpiJob(c.size, self.command, hosts, hostfile, extra_args=extra,
                                   crowded=self._crowded(c.master_host), tune_mpi=self.tune_mpi),
                            self.mpirun, self.mpi.kind, full)
        if self.transport == "netns":  # the group's mpirun runs inside its host's namespace
            cmd = wrap("netns", c.master_host, cmd, env, self.base_env)
        return cmd, full

    def _crowded(self, host: str) -> bool:
        """More processes on ``host``'s cores than this machine has (hosts alike assumed):
        the group's MPI then yields when idle instead of spinning on cores others need."""
        scheduler = self.plan.scheduler_host
        procs = self._procs(host) + (scheduler is not None and self._shares_cores(scheduler, host))
        return procs > (os.cpu_count() or 1)

    def commands(self) -> List[str]:
        """Every command with its settings, as one would type them by hand."""
        lines = []
        if self.plan.num_servers:
            lines.append(self._show("scheduler", *self._ps_node("scheduler", self.plan.scheduler_host)))
            for i, host in enumerate(self.plan.server_hosts):
                lines.append(self._show(f"server {i}", *self._ps_node("server", host)))
        for c in self.plan.clients:
            lines.append(self._show(f"client {c.client}", *self.client(c)))
        return lines

    def _show(self, name: str, cmd: List[str], env: Dict[str, str]) -> str:
        shown = ("DMLC_", "KVHYBRID_", "PS_", "OMP_")
        settings = " ".join(f"{k}={shlex.quote(v) if k != SECRET_VAR else '<secret>'}"
                            for k, v in sorted(env.items())
                            if k.startswith(shown) or k in DEFAULT_ENV)
        return f"  {name}: {settings} {shlex.join(cmd)}".rstrip()

    def run(self, sup: Supervisor) -> int:
        try:
            for c in self.plan.clients:
                os.makedirs(os.path.join(self.tmpdir, f"client{c.client}"), exist_ok=True)
            return self._run(sup)
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            take_back_secret(self.secret_files)

    def _run(self, sup: Supervisor) -> int:
        plan = self.plan
        if plan.num_servers:
            if self.transport == "ssh":
                try:
                    self.secret_files = hand_secret(
                        {plan.scheduler_host, *plan.server_hosts}, self.base_env[SECRET_VAR])
                except HostError as exc:   # nothing started yet
                    log.error("%s: check that /tmp is writable there and retry", exc)
                    return 2
            if not self._start_scheduler(sup):
                return 1
            for i, host in enumerate(plan.server_hosts):
                sup.start(f"server {i}", host, *self._ps_node("server", host), essential=False)
        for c in plan.clients:
            sup.start(f"client {c.client}", c.master_host, *self.client(c), essential=True,
                      restarts=self.restarts, tag=output_tag(self.mpi))
        return sup.wait()

    def _start_scheduler(self, sup: Supervisor) -> bool:
        """Start the scheduler; a port taken between probe and bind means another try.

        ps-lite's scheduler binds its port only after MXNet is imported (seconds on a busy
        machine) and exits on "bind failed": wait for one or the other.
        """
        host = self.plan.scheduler_host
        for attempt in range(1, SCHEDULER_TRIES + 1):
            self.port = free_port(self.transport, host)
            proc = sup.start("scheduler", host, *self._ps_node("scheduler", host), essential=False)
            deadline = time.monotonic() + SCHEDULER_BIND_WAIT
            while proc.popen.poll() is None and not listening(
                    proc.popen.pid, self.transport, self.addresses[host], self.port):
                if time.monotonic() > deadline:
                    log.warning("the scheduler on %s has not opened port %d in %d s; going on",
                                host, self.port, SCHEDULER_BIND_WAIT)
                    return True
                time.sleep(0.1)
            if proc.popen.poll() is None:
                return True
            log.warning("the scheduler exited before opening port %d (attempt %d of %d); retrying",
                        self.port, attempt, SCHEDULER_TRIES)
            sup.procs.remove(proc)
        log.error("the scheduler did not start in %d tries; its last output:\n%s",
                  SCHEDULER_TRIES, "\n".join(proc.tail))
        return False


def build_job(args, plan: JobPlan) -> "Job":
    if args.restarts and not plan.num_servers:
        raise SizingError("--restarts restarts a failed client group while the others train "
                          "on, which needs parameter servers between the groups (an "
                          "asynchronous or elastic store): add --servers, or drop --restarts")
    if args.launcher == "ssh" and not args.dry_run:
        check_ssh(h.name for h in plan.spec.hosts)
    job = Job(plan, args.command, shlex.split(args.mpi_args), args.interface,
              tune_mpi=not args.no_mpi_tuning, restarts=args.restarts)
    # a dry run contacts no host: its port (shown, not used) is one free here
    where = "local" if args.dry_run and args.launcher in ("ssh", "slurm") else args.launcher
    job.port = free_port(where, plan.scheduler_host) if plan.num_servers else None
    return job


def run_once(args, plan: JobPlan) -> int:
    job = build_job(args, plan)
    sup = Supervisor()
    # from the first start on, not only once it waits: a SIGTERM while the scheduler binds
    # (a --tune trial cut off) would otherwise leave the processes of their own sessions
    try:
        with signals_interrupt():
            rc = job.run(sup)
    except KeyboardInterrupt as exc:
        log.error("%s: stopping every process of the job",
                  "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted")
        sup.stop_all()
        return 143 if isinstance(exc, Terminated) else 130
    if rc == 0:
        log.info("the job finished")
    else:
        log.error("the job failed (exit code %d)", rc)
    return rc


def tune_partitions(args, plan: JobPlan, sig: str) -> int:
    if not plan.num_servers:
        log.error("--tune-partitions: partitions split row_sparse tables on the parameter "
                  "servers, and this job has none: add --servers (or --auto --sparse)")
        return 2

    def run_job(env):
        os.environ.update(env)
        return run_once(args, plan)

    from kvhybrid.kvstore.ps.link import MAX_PARTITIONS  # imports MXNet: only when tuning
    start = tune.remembered(sig) or len(set(plan.server_hosts))
    return tune.tune(run_job, sig, start, MAX_PARTITIONS, args.tune_samples, args.tune_out)


def trial_command(args, shape: "shape_tune.Shape") -> List[str]:
    """The launcher's command for one --tune trial: this job's flags in ``shape``."""
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(args.num_workers),
           "--launcher", args.launcher]
    for flag, value in (("-H", args.hosts), ("--hostfile", args.hostfile),
                        ("--interface", args.interface), ("--mpi-args", args.mpi_args)):
        if value:
            cmd += [flag, value]
    if args.no_mpi_tuning:
        cmd.append("--no-mpi-tuning")
    return cmd + shape.flags() + list(args.command)


def choose_shape(args, hosts) -> int:
    """--tune, or a plain run of a job that an earlier --tune remembered: set the shape in
    ``args``. Returns an exit code (non-zero: stop)."""
    one_group = plan_job(JobSpec(args.num_workers, 1, 0, tuple(hosts), args.launcher))
    names = {name for name, _ in one_group.clients[0].ranks}   # the hosts N workers fill
    used = [(h.name, h.slots) for h in hosts if h.name in names]
    sig = shape_tune.signature(args.command, args.num_workers, used, args.launcher)
    if args.tune:
        grid = shape_tune.Grid(args.num_workers, len(used))
        try:
            chosen = shape_tune.tune_shape(
                grid, sig, lambda shape: trial_command(args, shape),
                lambda shape: tune.signature(args.command, args.num_workers, shape.clients,
                                             shape.servers),
                args.tune_budget, args.tune_samples, args.tune_out)
        except KeyboardInterrupt as exc:   # (the trial's job is stopped)
            return 143 if isinstance(exc, Terminated) else 130
        if chosen is None:
            log.error("--tune: no trial ran to the end (the table says why): fix the job, "
                      "or give its shape with --clients and --servers")
            return 1
    else:
        chosen = shape_tune.remembered(sig)
        if chosen is None or args.clients is not None or args.servers is not None \
                or args.auto or args.row_masters != "auto":
            return 0
        log.info("shape %s, from an earlier --tune of this job (%s); give --clients and "
                 "--servers to choose another", chosen.describe(), tune.cache_path())
    args.clients, args.servers, args.row_masters = \
        chosen.clients, chosen.servers, chosen.row_masters
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="kvhybrid-launch: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        hosts = job_hosts(args)
        rc = choose_shape(args, hosts)
        if rc:
            return rc
        plan = make_plan(args, hosts)
        job = build_job(args, plan)
    except (SizingError, HostError, FileNotFoundError, ValueError, OSError) as exc:
        print(f"kvhybrid-launch: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(plan, {"scheduler": job.port}), flush=True)
    threads = job.omp_summary()
    if threads:
        print(threads, flush=True)
    if args.dry_run:
        print("commands (the same job by hand):\n" + "\n".join(job.commands()), flush=True)
        shutil.rmtree(job.tmpdir, ignore_errors=True)
        return 0
    shutil.rmtree(job.tmpdir, ignore_errors=True)
    sig = tune.signature(args.command, args.num_workers, plan.num_clients, plan.num_servers)
    if args.tune_partitions:
        try:
            return tune_partitions(args, plan, sig)
        except OSError as exc:
            print(f"kvhybrid-launch: error: {exc}", file=sys.stderr)
            return 2
    if plan.num_servers and not os.environ.get("KVHYBRID_PARTITIONS"):
        tuned = tune.remembered(sig)
        if tuned:
            os.environ["KVHYBRID_PARTITIONS"] = str(tuned)
            log.info("KVHYBRID_PARTITIONS=%d, from an earlier --tune-partitions of this job "
                     "(%s)", tuned, tune.cache_path())
    return run_once(args, plan)


if __name__ == "__main__":
    sys.exit(main())
