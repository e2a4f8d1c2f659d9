"""Emulated hosts for tests: Linux network namespaces joined by a veth pair.

Each namespace is a "host" with its own interface and address (in a /24 that
exists only between these namespaces); nothing is sent anywhere else.
"""
from __future__ import annotations

import os
import subprocess
from typing import List


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def netns_available() -> bool:
    probe = f"kvh-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, FileNotFoundError, OSError):
        return False
    _ip("netns", "del", probe)
    return True


class TwoHosts:
    """Namespaces ``<prefix>a`` and ``<prefix>b`` at 10.231.<n>.1 and .2, joined by veth."""

    def __init__(self):
        tag = os.getpid() % 250
        self.names: List[str] = [f"kvh{tag}a", f"kvh{tag}b"]
        self.addresses = [f"10.231.{tag}.1", f"10.231.{tag}.2"]
        self._veth = (f"kvh{tag}va", f"kvh{tag}vb")

    def __enter__(self) -> "TwoHosts":
        self.close()
        for name in self.names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("link", "add", self._veth[0], "netns", self.names[0], "type", "veth",
            "peer", "name", self._veth[1], "netns", self.names[1])
        for name, veth, addr in zip(self.names, self._veth, self.addresses):
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", veth)
            _ip("-n", name, "link", "set", veth, "up")
        return self

    def close(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def __exit__(self, *exc) -> None:
        self.close()
