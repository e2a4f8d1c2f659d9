"""Hosts and their slots, from ``-H a:2,b:2`` or a hostfile of ``host slots=N`` lines."""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import List

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


@dataclass(frozen=True)
class Host:
    name: str
    slots: int

    @property
    def is_local(self) -> bool:
        return is_local_name(self.name)


def is_local_name(name: str) -> bool:
    """Whether ``name`` is this machine (loopback or its own host name)."""
    return name in LOCAL_NAMES or name in (socket.gethostname(), socket.getfqdn())


class HostError(ValueError):
    """A host list or hostfile that cannot be used."""


def parse_host_list(text: str) -> List[Host]:
    hosts = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, slots = item.partition(":")
        hosts.append(Host(name, _slots(slots or "1", item)))
    if not hosts:
        raise HostError(f"-H {text!r} names no host: use e.g. -H node1:4,node2:4")
    return hosts


def parse_hostfile(path: str) -> List[Host]:
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"(\S+?)(?::(\d+))?(?:\s+slots\s*=\s*(\d+))?(?:\s+.*)?", line)
            if m is None:
                raise HostError(f"{path}:{number}: cannot read {line!r}: write 'host slots=N'")
            hosts.append(Host(m.group(1), _slots(m.group(3) or m.group(2) or "1",
                                                 f"{path}:{number}")))
    if not hosts:
        raise HostError(f"hostfile {path} names no host: write one 'host slots=N' line per host")
    return hosts


def _slots(raw: str, where: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise HostError(f"{where}: slots must be an integer >= 1, got {raw!r}")
    return int(raw)


def local_hosts(num_workers: int) -> List[Host]:
    return [Host("localhost", num_workers)]
