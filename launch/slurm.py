"""Running inside a Slurm allocation (``salloc``, ``sbatch``): its nodes and tasks, read
from the environment Slurm sets, and the ``srun`` that starts one process on a node.

The client groups' ``mpirun`` needs nothing from here: Open MPI and MPICH started inside an
allocation reach its nodes through ``srun`` themselves.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from typing import List, Mapping

from .hosts import Host, HostError
from .mpirun import MpiImplementation, runtime_setting

#: a node list term with one bracketed range list, e.g. ``node[01-03,7]-ib``
_BRACKET = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def expand_nodelist(text: str) -> List[str]:
    """``SLURM_JOB_NODELIST`` written out: ``"a[1-3,07],b"`` -> a1, a2, a3, a07, b.
    Zero padding is kept (``n[08-10]`` -> n08, n09, n10); several brackets expand in turn."""
    nodes: List[str] = []
    for term in _split_top_level(text):
        nodes.extend(_expand_term(term))
    if not nodes:
        raise HostError(f"SLURM_JOB_NODELIST={text!r} names no node")
    return nodes


def _split_top_level(text: str) -> List[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


def _expand_term(term: str) -> List[str]:
    m = _BRACKET.match(term)
    if m is None:
        return [term]
    head, ranges, tail = m.groups()
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise HostError(f"cannot read the node range [{ranges}] in {term!r}")
        width = len(lo)
        for number in range(int(lo), int(hi or lo) + 1):
            out.extend(_expand_term(f"{head}{number:0{width}d}{tail}"))
    return out


def expand_counts(text: str) -> List[int]:
    """``SLURM_TASKS_PER_NODE``'s compressed form written out: ``"2(x3),1"`` -> 2, 2, 2, 1."""
    counts = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if m is None:
            raise HostError(f"cannot read the task counts {text!r} (Slurm writes e.g. 2(x3),1)")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def allocation_hosts(env: Mapping[str, str]) -> List[Host]:
    """The allocation's nodes with their task slots, from Slurm's variables: the nodes from
    ``SLURM_JOB_NODELIST``, the slots from ``SLURM_TASKS_PER_NODE`` (or
    ``SLURM_NTASKS_PER_NODE``, else one per node)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise HostError("--launcher slurm runs inside a Slurm allocation, and SLURM_JOB_NODELIST "
                        "is not set: start it from salloc or an sbatch script (or give -H)")
    nodes = expand_nodelist(nodelist)
    if env.get("SLURM_TASKS_PER_NODE"):
        slots = expand_counts(env["SLURM_TASKS_PER_NODE"])
    elif env.get("SLURM_NTASKS_PER_NODE"):
        slots = [int(env["SLURM_NTASKS_PER_NODE"])] * len(nodes)
    else:
        slots = [1] * len(nodes)
    if len(slots) != len(nodes):
        raise HostError(f"SLURM_TASKS_PER_NODE={env.get('SLURM_TASKS_PER_NODE')!r} gives "
                        f"{len(slots)} counts for the {len(nodes)} nodes of "
                        f"SLURM_JOB_NODELIST={nodelist!r}")
    return [Host(n, s) for n, s in zip(nodes, slots)]


def check_hosts_in_allocation(hosts: List[Host], env: Mapping[str, str]) -> None:
    """Every host named with -H/--hostfile must be a node of the allocation, with no more
    slots than Slurm gave it."""
    given = {h.name: h.slots for h in allocation_hosts(env)}
    for host in hosts:
        if host.name not in given:
            raise HostError(f"host {host.name!r} is not a node of this Slurm allocation "
                            f"({', '.join(given)}): name its nodes, or leave out -H")
        if host.slots > given[host.name]:
            raise HostError(f"host {host.name!r} is given {host.slots} slots, and the "
                            f"allocation has {given[host.name]} tasks there: ask salloc/sbatch "
                            "for more tasks per node, or name fewer slots")


def find_srun() -> str:
    path = shutil.which("srun")
    if path is None:
        raise HostError("--launcher slurm needs srun on PATH: run it on a Slurm cluster, "
                        "inside salloc or sbatch")
    return path


@lru_cache(maxsize=1)
def _srun_overlaps() -> bool:
    """Whether this srun has --overlap (Slurm 20.11+, where steps no longer share CPUs
    unless asked: the servers' steps would otherwise hold CPUs the groups need)."""
    out = subprocess.run([find_srun(), "--help"], capture_output=True, text=True, timeout=30)
    return "--overlap" in out.stdout


def srun_prefix(host: str) -> List[str]:
    """One process on ``host`` as a step of the allocation; it gets the launcher's
    environment (srun's default ``--export=ALL``), so nothing secret is on a command line."""
    return [find_srun(), *(["--overlap"] if _srun_overlaps() else []), "--nodes=1",
            "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=1", "--quiet"]


def mpirun_args(mpi: MpiImplementation) -> List[str]:
    """Arguments making mpirun's own srun (the one starting its daemons) share the nodes'
    CPUs with the scheduler's and servers' steps."""
    if mpi.kind == "openmpi" and _srun_overlaps():
        return runtime_setting(mpi, "plm_slurm_args", "--overlap")
    return []

