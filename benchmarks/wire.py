"""Bytes on the wire per host and step, counted, next to Parallax's Table 3.

Counted: every worker reads its network namespace's interface counters
(``/proc/net/dev``: what the kernel sent and received, headers included, and the packets)
before and after the timed steps. Less ``FRAMING_BYTES`` a packet, that is the TCP payload
the processes exchanged, what Table 3 counts (every packet of the emulated links is a
TCP/IPv4 segment of ps-lite or MPI, an acknowledgement carrying none). The veth links hand
the kernel's segmentation offload whole segments of up to 64 KB, counted as one packet
each, so the headers taken off are a lower bound and the payload an upper one. On an emulated cluster a host's one interface carries everything
that host's worker and server exchange with the other hosts, which is what Table 3
counts per machine. On loopback every process shares ``lo``, so nothing is per host and
nothing is reported.

Predicted: Table 3's "m variables" column (``kvstore/routing.py``), per machine and
step, for the routing each system uses: dense keys by allreduce or through the servers
(the same bytes in that column), tables as rows through the servers, or densified and
allreduced.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from kvhybrid.kvstore.routing import transfer_bytes


#: bytes of headers in every packet on the emulated links: Ethernet 14, IPv4 20, TCP 20 and
#: its timestamp option 12 (Linux's default)
FRAMING_BYTES = 14 + 20 + 20 + 12


def interface_counters() -> Dict[str, Dict[str, int]]:
    """Bytes and packets received plus sent by each interface of this process's network
    namespace, loopback excluded: ``{name: {"bytes": b, "packets": p}}``."""
    counts = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            fields = data.split()
            if name.strip() != "lo":
                counts[name.strip()] = {"bytes": int(fields[0]) + int(fields[8]),
                                        "packets": int(fields[1]) + int(fields[9])}
    return counts


def interface_bytes() -> Dict[str, int]:
    """Bytes received plus sent by each interface, loopback excluded."""
    return {name: c["bytes"] for name, c in interface_counters().items()}


def per_host(readings: Sequence[dict], payload: bool = False) -> Optional[float]:
    """Mean bytes per host and step from the workers' readings (``{"interfaces": {name:
    bytes}, "packets": {name: packets}, "steps": n}``); a host's interface counted once
    however many workers read it (``cluster.py`` names every host's interface differently:
    eth0, eth1, ...); ``payload``: less ``FRAMING_BYTES`` a packet (None for readings
    without packets). None when no worker saw any interface but loopback."""
    hosts: Dict[str, float] = {}
    for r in readings:
        if payload and "packets" not in r:
            return None
        for name, count in r["interfaces"].items():
            if payload:
                count -= FRAMING_BYTES * r["packets"][name]
            hosts[name] = max(hosts.get(name, 0.0), count / r["steps"])
    return sum(hosts.values()) / len(hosts) if hosts else None


def table3(routing: str, dense_bytes: float, table_bytes: Sequence[float],
           alphas: Sequence[float], machines: int) -> float:
    """Table 3's bytes per machine and step for ``routing``: ``"rows"`` (tables' rows
    through the servers, each touched at rate α by each machine) or ``"dense"`` (tables
    densified and allreduced); dense keys move the same bytes either way."""
    total = transfer_bytes("dense", "ar", dense_bytes, machines, m=1)
    for w, alpha in zip(table_bytes, alphas):
        total += (transfer_bytes("sparse", "ps", w, machines, alpha) if routing == "rows"
                  else transfer_bytes("dense", "ar", w, machines))
    return total


def describe(measured: Optional[float], predicted: float) -> List[str]:
    """Table cells: counted MB, Table 3 MB, and their ratio."""
    if measured is None:
        return ["", f"{predicted / 2**20:.3f}", ""]
    return [f"{measured / 2**20:.3f}", f"{predicted / 2**20:.3f}", f"{measured / predicted:.2f}×"]
