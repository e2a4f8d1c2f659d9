"""How a command reaches a host: here, over ssh, as a Slurm job step, or inside a network
namespace.

``ssh`` runs a command on a host with ``ssh -tt`` in the same directory (a file
system shared by the hosts, as on a cluster), handing it the job's settings on
the remote command line of ``env``; the pseudo-terminal makes the remote process
get SIGHUP, and end, when the launcher stops its ssh. ``slurm`` starts it with
``srun`` on a node of the allocation (``slurm.py``). ``netns`` treats each host
name as a Linux network namespace on this machine (``ip netns exec NAME ...``):
several emulated hosts, each with its own interfaces and addresses, for testing
a multi-host job on one machine.
"""
from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shlex
import shutil
import socket
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterable, List, Optional

from . import slurm
from .hosts import HostError, is_local_name
from kvhybrid.kvstore.ps.auth import SECRET_VAR
from kvhybrid.procnet import listening_ports

log = logging.getLogger("kvhybrid.launch")

TRANSPORTS = ("local", "ssh", "netns", "slurm")
#: Linux's ioctl that reads an interface's IPv4 address
_SIOCGIFADDR = 0x8915

#: every ssh the launcher runs: never ask for a password (a prompt nobody sees would hang
#: the job), give up on a host that does not answer
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
#: seconds the pre-flight check gives every host to run ``true`` over ssh
SSH_CHECK_TIMEOUT = 20
#: variables a remote process gets from the launcher's environment (a remote shell starts
#: with sshd's, not the launcher's); the same families mpirun forwards to its ranks
REMOTE_PREFIXES = ("KVHYBRID_", "MXNET_", "OMP_", "DMLC_", "PS_", "PYTHON", "GLIBC_TUNABLES",
                   "LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV")


def wrap(transport: str, host: str, cmd: List[str], env: Dict[str, str],
         base_env: Dict[str, str]) -> List[str]:
    """The command line that runs ``cmd`` on ``host`` with ``env`` added to its environment."""
    if transport == "local" or (transport == "ssh" and is_local_name(host)):
        return cmd
    if transport == "ssh":
        remote_env = {k: v for k, v in base_env.items() if k.startswith(REMOTE_PREFIXES)}
        remote_env.update(env)
        remote_env.pop(SECRET_VAR, None)   # ps shows a command line: it goes by file
        assign = [f"{k}={v}" for k, v in sorted(remote_env.items())]
        remote = f"cd {shlex.quote(os.getcwd())} && exec env " \
                 + " ".join(map(shlex.quote, assign + list(cmd)))
        return ["ssh", *SSH_OPTIONS, "-tt", host, remote]
    if transport == "slurm":   # srun hands the step the launcher's environment
        return slurm.srun_prefix(host) + list(cmd)
    assign = [f"{k}={v}" for k, v in sorted(env.items()) if base_env.get(k) != v]
    if transport == "netns":
        # its own hostname too (a UTS namespace), as a real host has: Open MPI names its
        # shared-memory files by hostname, and emulated hosts sharing one would collide
        return ["ip", "netns", "exec", host, "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', host, "env", *assign, *cmd]
    raise ValueError(f"unknown transport {transport!r}")


def hand_secret(hosts: Iterable[str], secret: str) -> Dict[str, str]:
    """Write the job's secret into a file only this user can read on each remote host (over
    ssh's standard input, no pseudo-terminal to echo it); {host: the file's path}."""
    paths = {}
    for host in sorted(h for h in set(hosts) if not is_local_name(h)):
        path = f"/tmp/kvhybrid-{secrets.token_hex(8)}.secret"
        try:
            r = subprocess.run(["ssh", *SSH_OPTIONS, host, f"umask 077 && cat > {path}"],
                               input=secret + "\n", capture_output=True, text=True,
                               timeout=SSH_CHECK_TIMEOUT)
            why = None if r.returncode == 0 else _last_line(r.stderr)
        except subprocess.TimeoutExpired:
            why = f"no answer in {SSH_CHECK_TIMEOUT} s"
        if why is not None:
            take_back_secret(paths)
            raise HostError(f"host {host!r}: cannot write the job's secret to {path} ({why})")
        paths[host] = path
    return paths


def take_back_secret(paths: Dict[str, str]) -> None:
    """Remove the secret files ``hand_secret`` wrote (best effort: the job is over)."""
    for host, path in paths.items():
        try:
            subprocess.run(["ssh", *SSH_OPTIONS, host, f"rm -f {path}"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=SSH_CHECK_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            log.warning("host %r did not answer in %d s: remove %s there by hand", host,
                        SSH_CHECK_TIMEOUT, path)


def address(transport: str, host: str, interface: Optional[str] = None) -> str:
    """The IPv4 address the host's processes advertise to the others: that of ``interface``
    if one is named, else loopback for a local run, else the host's (namespace's) own."""
    if transport == "local" and interface:
        found = _local_address(interface)
        if found is None:
            raise ValueError(f"host {host!r} has no IPv4 address on {interface}: name one "
                             "with --interface")
        return found
    if transport == "netns":
        out = subprocess.run(["ip", "netns", "exec", host, "ip", "-4", "-o", "addr", "show"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode != 0:
            raise ValueError(f"network namespace {host!r} not found: create it with "
                             f"`ip netns add {host}` (or fix the hostfile)")
        for line in out.stdout.splitlines():
            parts = line.split()
            if (parts[1] == interface) if interface else parts[1] != "lo":
                return parts[3].split("/")[0]
        raise ValueError(f"host {host!r} has no IPv4 address on "
                         f"{interface or 'an interface besides lo'}: name one with --interface")
    if host in ("localhost", "127.0.0.1") or transport == "local":
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}") from None


def _local_address(interface: str) -> Optional[str]:
    """This machine's IPv4 address on ``interface`` (None if it has none), asked of the
    kernel directly (SIOCGIFADDR): a local run needs no ``ip`` tool."""
    if interface not in {name for _, name in socket.if_nameindex()}:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            reply = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                struct.pack("256s", interface.encode()[:15]))
        except OSError:   # the interface has no IPv4 address
            return None
    return socket.inet_ntoa(reply[20:24])


def listening(pid: int, transport: str, addr: str, port: int) -> bool:
    """Whether process ``pid`` (started by ``wrap``) now listens on ``port``.

    Here and in a namespace the command keeps its pid (every wrapper execs), so its own
    sockets are matched against its namespace's TCP table; over ssh, a connection to
    ``addr:port`` is the best there is.
    """
    if transport not in ("local", "netns"):
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return True
        except OSError:
            return False
    try:
        return port in listening_ports(pid)
    except OSError:   # gone, or not ours to read
        return False


def free_port(transport: str, host: str) -> int:
    """A port that was free a moment ago on ``host`` (the scheduler is restarted on a
    collision)."""
    if transport in ("netns", "ssh", "slurm") and not is_local_name(host):
        code = "import socket; s=socket.socket(); s.bind(('',0)); print(s.getsockname()[1])"
        out = subprocess.run(_python_on(transport, host, code), capture_output=True, text=True,
                             timeout=SSH_CHECK_TIMEOUT)
        if out.returncode != 0 or not out.stdout.strip().isdigit():
            raise HostError(f"host {host!r}: cannot find a free port for the scheduler "
                            f"(`{sys.executable}` there failed: {_last_line(out.stderr)})")
        return int(out.stdout.strip())
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _python_on(transport: str, host: str, code: str) -> List[str]:
    """``python -c code`` on ``host`` through ``transport`` alone: only the tool of the
    transport asked for is run (a machine without Slurm has no srun, one without ssh no
    ssh). The launcher's interpreter, as the job's (a file system shared by the hosts)."""
    if transport == "netns":
        return ["ip", "netns", "exec", host, sys.executable, "-c", code]
    if transport == "ssh":
        return ["ssh", *SSH_OPTIONS, host, shlex.join([sys.executable, "-c", code])]
    if transport == "slurm":
        return slurm.srun_prefix(host) + [sys.executable, "-c", code]
    raise ValueError(f"unknown transport {transport!r}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def check_ssh(hosts: Iterable[str]) -> None:
    """Fail before anything starts unless every remote host runs ``true`` over ssh
    without a password; the error names the first host that does not, with ssh's reason."""
    if shutil.which("ssh") is None:
        raise HostError("--launcher ssh needs the ssh client on this machine's PATH: "
                        "install it (apt-get install openssh-client)")
    remote = sorted({h for h in hosts if not is_local_name(h)})

    def probe(host: str) -> Optional[str]:
        try:
            r = subprocess.run(["ssh", *SSH_OPTIONS, host, "true"], capture_output=True,
                               text=True, stdin=subprocess.DEVNULL, timeout=SSH_CHECK_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"no answer in {SSH_CHECK_TIMEOUT} s"
        return None if r.returncode == 0 else _last_line(r.stderr)

    with ThreadPoolExecutor(max_workers=min(16, len(remote) or 1)) as pool:
        for host, why in zip(remote, pool.map(probe, remote)):
            if why is not None:
                raise HostError(f"host {host!r} cannot be reached over ssh ({why}): check the "
                                f"name, that sshd runs there and that `ssh {host} true` works "
                                "without a password")
