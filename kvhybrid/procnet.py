"""A process's TCP sockets, read from ``/proc`` (its own network namespace's tables; psutil
reads the caller's). Used by the launcher (has the scheduler bound its port?), by a server
(who is connected to me?) and by the tests; imports nothing heavy."""
from __future__ import annotations

import os
from typing import Iterable, List, Union

LISTEN, ESTABLISHED = "0A", "01"


def tcp_sockets(pid: Union[int, str] = "self",
                tables: Iterable[str] = ("tcp", "tcp6")) -> List[List[str]]:
    """The rows of ``/proc/PID/net/{tables}`` that are sockets of process ``pid``:
    [slot, local, remote, state, ..., inode, ...]. Raises OSError if it is gone."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    rows = []
    for table in tables:
        with open(f"/proc/{pid}/net/{table}") as f:
            rows += [row for row in (line.split() for line in f.readlines()[1:])
                     if row[9] in inodes]
    return rows


def port(field: str) -> int:
    """The port of a ``/proc/net/tcp`` address field (``0100007F:1F90``)."""
    return int(field.rsplit(":", 1)[1], 16)


def listening_ports(pid: Union[int, str] = "self") -> List[int]:
    return sorted({port(row[1]) for row in tcp_sockets(pid) if row[3] == LISTEN})
