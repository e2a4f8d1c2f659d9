"""A real Slurm on this machine, for testing ``kvhybrid-launch --launcher slurm``.

Debian's slurm-wlm 22.05: slurmctld on a login node and one slurmd per compute node, each
an emulated machine (a network namespace from ``benchmarks.cluster`` with its own host
name), authenticated by a munged of the test's own (own key, own socket). Jobs are
submitted from the login node with ``salloc``/``sbatch`` as on a cluster; their steps run on
the nodes. Everything is stopped and removed on exit.

slurmd enters its node's network with ``nsenter --net`` rather than ``ip netns exec``:
the latter remounts /sys, which hides the cgroup file systems slurmd 22.05 insists on; the
node names reach its processes through a hosts file bind-mounted in a mount namespace of
its own.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.cluster import EmulatedCluster
from tests.support.ssh_hosts import forget_machines, name_machines

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
#: CPUs each emulated node declares (slurmd is told to believe the configuration)
NODE_CPUS = 4

CONFIG = """\
ClusterName=kvhybrid-test
SlurmctldHost={login}({login_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool-%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
{nodes}
PartitionName=test Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


def slurm_available() -> bool:
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return False
    return all(os.access(d, os.X_OK) for d in DAEMONS) and shutil.which("salloc") is not None \
        and shutil.which("nsenter") is not None


class SlurmCluster:
    """slurmctld on ``login``, slurmd on each of ``nodes`` (network namespaces)."""

    def __init__(self, workdir: Path, nodes: int = 2):
        self.state = Path(workdir)
        self.cluster = EmulatedCluster(hosts=nodes + 1, rate=None, prefix="kvl")
        self.login = self.cluster.names[0]
        self.nodes: List[str] = self.cluster.names[1:]
        self.conf = self.state / "slurm.conf"
        self._munge_dir = Path(tempfile.mkdtemp(prefix="kvh-munge-"))  # munge's, not root's
        self._daemons: List[subprocess.Popen] = []

    @property
    def env(self) -> Dict[str, str]:
        """What a user's shell on this cluster has: where Slurm's configuration is."""
        return {"SLURM_CONF": str(self.conf)}

    def on_login(self, cmd: List[str]) -> List[str]:
        return ["ip", "netns", "exec", self.login, *map(str, cmd)]

    def __enter__(self) -> "SlurmCluster":
        self.cluster.__enter__()
        try:
            name_machines(self.cluster)
            self._start_munge()
            self._write_config()
            env = {**os.environ, **self.env}
            self._daemon(["ip", "netns", "exec", self.login], self.login,
                         "exec /usr/sbin/slurmctld -D -i", env)
            hosts = self.state / "hosts"   # the names, for the nodes' own processes
            hosts.write_text((Path("/etc/netns") / self.login / "hosts").read_text())
            for node in self.nodes:
                self._daemon(["nsenter", f"--net=/run/netns/{node}", "unshare", "--mount"], node,
                             f"mount --bind {hosts} /etc/hosts && exec /usr/sbin/slurmd -D", env)
            self._wait_idle(env)
        except BaseException:
            self.close()
            raise
        return self

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        key = self._munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (self._munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self._munge_dir.chmod(0o711)   # munged: its socket's directory searchable by all
        d = self._munge_dir
        r = subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged",
                            f"--socket={d / 'munge.socket'}", f"--key-file={key}",
                            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                            f"--seed-file={d / 'munged.seed'}"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"munged did not start: {r.stderr.strip()}")

    def _write_config(self) -> None:
        (self.state / "ctld").mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.state / f"spool-{node}").mkdir(exist_ok=True)
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={NODE_CPUS} State=UNKNOWN"
                          for n, a in zip(self.nodes, self.cluster.addresses[1:]))
        self.conf.write_text(CONFIG.format(
            login=self.login, login_address=self.cluster.addresses[0],
            munge_socket=self._munge_dir / "munge.socket", state=self.state, nodes=nodes,
            node_names=",".join(self.nodes)))

    def _daemon(self, enter: List[str], host: str, command: str, env) -> None:
        """``command`` on ``host``, under that host's name (slurmctld and slurmd check it)."""
        log = open(self.state / f"{host}.out", "w")
        self._daemons.append(subprocess.Popen(
            [*enter, "unshare", "--uts", "--", "sh", "-c", f'hostname "$0" && {command}',
             host], env=env, stdout=log, stderr=subprocess.STDOUT))

    def _wait_idle(self, env, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        states = ""
        while time.monotonic() < deadline:
            r = subprocess.run(self.on_login(["sinfo", "-h", "-N", "-o", "%t"]), env=env,
                               capture_output=True, text=True, timeout=30)
            states = r.stdout.split()
            if r.returncode == 0 and states == ["idle"] * len(self.nodes):
                return
            if any(d.poll() is not None for d in self._daemons):
                break
            time.sleep(0.5)
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}"
                         for p in sorted(self.state.glob("*.out")))
        raise RuntimeError(f"the Slurm nodes did not come up (sinfo: {states}):\n{logs}")

    def close(self) -> None:
        for proc in self._daemons:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._daemons:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        pid = self._munge_dir / "munged.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass
        shutil.rmtree(self._munge_dir, ignore_errors=True)
        forget_machines(self.cluster)
        self.cluster.close()

    def __exit__(self, *exc) -> None:
        self.close()
        self.cluster.__exit__(*exc)
