"""How a command reaches a host: here, over ssh, or inside a network namespace.

``netns`` treats each host name as a Linux network namespace on this machine
(``ip netns exec NAME ...``): several emulated hosts, each with its own
interfaces and addresses, for testing a multi-host job on one machine.
"""
from __future__ import annotations

import os
import shlex
import socket
import subprocess
from typing import Dict, List, Optional

TRANSPORTS = ("local", "ssh", "netns", "slurm")


def wrap(transport: str, host: str, cmd: List[str], env: Dict[str, str],
         base_env: Dict[str, str]) -> List[str]:
    """The command line that runs ``cmd`` on ``host`` with ``env`` added to its environment."""
    if transport == "local":
        return cmd
    assign = [f"{k}={v}" for k, v in sorted(env.items()) if base_env.get(k) != v]
    if transport == "netns":
        # its own hostname too (a UTS namespace), as a real host has: Open MPI names its
        # shared-memory files by hostname, and emulated hosts sharing one would collide
        return ["ip", "netns", "exec", host, "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', host, "env", *assign, *cmd]
    if transport == "ssh":
        remote = f"cd {shlex.quote(os.getcwd())} && env {' '.join(map(shlex.quote, assign))} " \
                 + " ".join(map(shlex.quote, cmd))
        return ["ssh", "-o", "BatchMode=yes", "-tt", host, remote]
    raise ValueError(f"unknown transport {transport!r}")


def address(transport: str, host: str, interface: Optional[str] = None) -> str:
    """The IPv4 address the host's processes advertise to the others: that of ``interface``
    if one is named, else loopback for a local run, else the host's (namespace's) own."""
    if transport in ("netns", "local") and (interface or transport == "netns"):
        prefix = ["ip", "netns", "exec", host] if transport == "netns" else []
        out = subprocess.run(prefix + ["ip", "-4", "-o", "addr", "show"],
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
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                for row in f.readlines()[1:]:
                    cols = row.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port \
                            and f"socket:[{cols[9]}]" in inodes:
                        return True
    except OSError:   # gone, or not ours to read
        pass
    return False


def free_port(transport: str, host: str) -> int:
    """A port that was free a moment ago (the scheduler is restarted on a collision)."""
    if transport == "netns":
        code = "import socket; s=socket.socket(); s.bind(('',0)); print(s.getsockname()[1])"
        out = subprocess.run(["ip", "netns", "exec", host, "python3", "-c", code],
                             capture_output=True, text=True, timeout=10)
        return int(out.stdout.strip())
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
