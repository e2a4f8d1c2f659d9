"""Emulated machines reached over real ssh: network namespaces, each running its own
OpenSSH server, for testing ``kvhybrid-launch --launcher ssh`` as on a cluster.

The namespaces come from ``benchmarks.cluster`` (one bridge, unshaped links); the first
is the login node where the launcher runs, the others are the hosts. Every namespace gets,
through ``ip netns exec``'s ``/etc/netns/NAME/`` overlay, a ``hosts`` file naming all of them
(plus ``ghost``, an address where no machine answers) and an ``ssh`` directory with a client
configuration using a key made for the test, and an sshd configuration trusting that key.
So the launcher and mpirun see what a cluster user sees: names that resolve, and
``ssh NAME`` that works without a password. Each sshd runs with its host's name (a UTS
namespace), which every session it starts inherits. Everything is removed on exit.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

from benchmarks.cluster import EmulatedCluster

SSHD = "/usr/sbin/sshd"

CLIENT_CONFIG = """\
Host *
  IdentityFile {key}
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
"""

SERVER_CONFIG = """\
ListenAddress 0.0.0.0
HostKey {host_key}
AuthorizedKeysFile {authorized}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
"""


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and shutil.which("ssh") is not None


def name_machines(cluster: EmulatedCluster, extra: Optional[Dict[str, str]] = None) -> None:
    """A ``hosts`` file naming every machine of ``cluster`` (and ``extra`` names), seen by
    each process started with ``ip netns exec`` (``/etc/netns/NAME/hosts``)."""
    names = {**dict(zip(cluster.names, cluster.addresses)), **(extra or {})}
    lines = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items())
    for name in cluster.names:
        etc = Path("/etc/netns") / name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(lines)


def forget_machines(cluster: EmulatedCluster) -> None:
    for name in cluster.names:
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


class SshHosts:
    """``login`` plus ``hosts`` namespaces with sshd running on the hosts."""

    def __init__(self, workdir: Path, hosts: int = 2):
        self.workdir = Path(workdir)
        self.cluster = EmulatedCluster(hosts=hosts + 1, rate=None, prefix="kvs")
        self.login = self.cluster.names[0]
        self.hosts: List[str] = self.cluster.names[1:]
        self.ghost = f"{self.cluster.prefix}ghost"
        self._sshd: Dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "SshHosts":
        self.cluster.__enter__()
        try:
            self._configure()
            for host in self.hosts:
                self._sshd[host] = subprocess.Popen(
                    ["ip", "netns", "exec", host, "unshare", "--uts", "--", "sh", "-c",
                     f'hostname "$0" && exec {SSHD} -D -e', host],
                    stdout=open(self.workdir / f"sshd-{host}.log", "w"),
                    stderr=subprocess.STDOUT)
            for host in self.hosts:
                self._wait_for_sshd(host)
        except BaseException:
            self.close()
            raise
        return self

    def _configure(self) -> None:
        key, host_key = self.workdir / "id_ed25519", self.workdir / "host_ed25519"
        for path in (key, host_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                           check=True, timeout=30)
        authorized = self.workdir / "authorized_keys"
        shutil.copy(f"{key}.pub", authorized)
        authorized.chmod(0o600)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        ghost_address = self.cluster.addresses[0].rsplit(".", 1)[0] + ".250"
        name_machines(self.cluster, {self.ghost: ghost_address})
        for name in self.cluster.names:
            etc = Path("/etc/netns") / name
            (etc / "ssh").mkdir(parents=True, exist_ok=True)
            (etc / "ssh" / "ssh_config").write_text(CLIENT_CONFIG.format(key=key))
            (etc / "ssh" / "sshd_config").write_text(SERVER_CONFIG.format(
                host_key=host_key, authorized=authorized))

    def _wait_for_sshd(self, host: str, seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        while True:
            r = subprocess.run(self.on_login(["ssh", "-o", "BatchMode=yes", "-o",
                                              "ConnectTimeout=2", host, "hostname"]),
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and r.stdout.strip() == host:
                return
            if time.monotonic() > deadline or self._sshd[host].poll() is not None:
                log = (self.workdir / f"sshd-{host}.log").read_text()
                raise RuntimeError(f"sshd on {host} did not answer in {seconds} s: "
                                   f"{r.stderr.strip()} / {log.strip()}")
            time.sleep(0.2)

    def on_login(self, cmd: List[str], named: bool = False) -> List[str]:
        """``cmd`` run on the login node; ``named``: with the login node's own host name, as
        MPICH's mpirun needs (its proxies on the hosts call back to mpirun's host by name)."""
        name = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.login] if named else []
        return ["ip", "netns", "exec", self.login, *name, *map(str, cmd)]

    def processes(self) -> Dict[str, Set[int]]:
        """Every process on each emulated machine, its sshd daemon left out."""
        out = {}
        for name in self.cluster.names:
            r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                               timeout=10)
            daemon = self._sshd.get(name)
            out[name] = {int(p) for p in r.stdout.split()} - ({daemon.pid} if daemon else set())
        return out

    def close(self) -> None:
        for proc in self._sshd.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        forget_machines(self.cluster)
        self.cluster.close()

    def __exit__(self, *exc) -> None:
        self.close()
        self.cluster.__exit__(*exc)
