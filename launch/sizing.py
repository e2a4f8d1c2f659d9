"""Sizing a job: workers per client group, which host runs what, and the table that shows it.

MXNET-MPI §4.1.2: given #workers, #clients and #servers, each client group
gets #workers / #clients workers (its rank 0 is the master, the ps-lite
worker); the scheduler and the servers are placed on the hosts; every client
group is its own ``mpirun``. With 0 servers there is one group and no
scheduler (pure MPI). ``--row-masters host`` (one group) makes each host's first
rank a ps-lite worker for its host's rows (Parallax's local aggregation); ``auto``, the
default, does so when the one group spans several hosts and there are servers.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import List, Optional, Tuple

from .hosts import Host


class SizingError(ValueError):
    """Workers, clients, servers and hosts that do not fit together; says what would."""


@dataclass(frozen=True)
class JobSpec:
    num_workers: int
    num_clients: Optional[int]        # None: decided by the rules below
    num_servers: Optional[int]
    hosts: Tuple[Host, ...]
    launcher: str = "local"
    auto: bool = False
    sparse: bool = False              # the model has row_sparse keys (for --auto)
    row_masters: str = "auto"         # who pushes rows: the group's master ("group"), each
                                      # host's first rank ("host"), or "auto" (_auto_row_masters)
    emulate_node_size: int = 0        # KVHYBRID_EMULATE_NODE_SIZE: ranks per emulated host


@dataclass
class ClientPlan:
    client: int
    ranks: List[Tuple[str, int]]      # (host, ranks on it), first host holds the master

    @property
    def master_host(self) -> str:
        return self.ranks[0][0]

    @property
    def spans_hosts(self) -> bool:
        """Whether the group's ranks lie on more than one host."""
        return len({host for host, _ in self.ranks}) > 1

    @property
    def size(self) -> int:
        return sum(n for _, n in self.ranks)


@dataclass
class JobPlan:
    spec: JobSpec
    num_clients: int
    num_servers: int
    workers_per_client: int
    scheduler_host: Optional[str]
    server_hosts: List[str] = field(default_factory=list)
    clients: List[ClientPlan] = field(default_factory=list)

    @property
    def ps_workers(self) -> int:
        """ps-lite workers (DMLC_NUM_WORKER): a master per client group, or with
        ``--row-masters host`` one per host of the group (per emulated host if emulated)."""
        if self.spec.row_masters != "host":
            return self.num_clients
        k = self.spec.emulate_node_size
        return sum(-(-n // k) if k else 1 for _, n in self.clients[0].ranks)


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_job(spec: JobSpec) -> JobPlan:
    n, hosts = spec.num_workers, list(spec.hosts)
    if n < 1:
        raise SizingError(f"-n must be at least 1, got {n}")
    servers = spec.num_servers
    if servers is None:
        servers = len(hosts) if (spec.auto and spec.sparse) else 0
    clients = spec.num_clients
    if clients is None:
        clients = len(hosts) if (spec.auto and servers > 0) else 1
    if servers < 0:
        raise SizingError(f"--servers must be >= 0, got {servers}")
    if clients < 1:
        raise SizingError(f"--clients must be >= 1, got {clients}")
    if clients > n:
        raise SizingError(f"--clients {clients} is more than the {n} workers: each client group "
                          f"needs at least one worker (use --clients <= {n})")
    if n % clients:
        choices = ", ".join(map(str, _divisors(n)))
        raise SizingError(f"{n} workers do not split into {clients} client groups of equal size: "
                          f"use --clients one of {choices}")
    if servers == 0 and clients > 1:
        raise SizingError(f"--clients {clients} needs --servers >= 1: client groups talk through "
                          "the parameter servers (use --clients 1 for pure MPI)")
    if spec.row_masters == "host" and (servers == 0 or clients != 1):
        raise SizingError("--row-masters host aggregates each host's rows of one client group "
                          "for the parameter servers: use it with --clients 1 and --servers >= 1")
    if spec.launcher == "local":
        remote = [h.name for h in hosts if not h.is_local]
        if remote:
            raise SizingError(f"host {remote[0]!r} is not this machine and --launcher local cannot "
                              "reach it: use --launcher ssh")
    per_client = n // clients
    if sum(h.slots for h in hosts) < n and not (len(hosts) == 1 and hosts[0].is_local):
        raise SizingError(f"the hosts have {sum(h.slots for h in hosts)} slots for {n} workers: "
                          "add hosts or slots")
    plan = JobPlan(spec, clients, servers, per_client,
                   scheduler_host=hosts[0].name if servers > 0 else None,
                   server_hosts=[hosts[i % len(hosts)].name for i in range(servers)])
    # Fill hosts slot by slot, client after client (a group may span hosts).
    free = [[h.name, h.slots if not (len(hosts) == 1 and h.is_local) else n] for h in hosts]
    cursor = 0
    for c in range(clients):
        need, ranks = per_client, []
        while need:
            while free[cursor][1] == 0:
                cursor += 1
            take = min(need, free[cursor][1])
            ranks.append((free[cursor][0], take))
            free[cursor][1] -= take
            need -= take
        plan.clients.append(ClientPlan(c, ranks))
    if spec.row_masters == "auto":
        plan.spec = replace(spec, row_masters=_auto_row_masters(plan))
    return plan


def _auto_row_masters(plan: JobPlan) -> str:
    """``host`` when the one client group, with servers, spans several hosts, else
    ``group``: one master's link would carry every host's rows in and then out again, where
    a master per host sends its host's rows once, summed, as Parallax does (4 emulated hosts
    at 1 Gbit/s: LM 1.15x, NMT 1.21x the throughput of one master; docs/launching.md)."""
    one_spanning = plan.num_clients == 1 and plan.clients[0].spans_hosts
    return "host" if plan.num_servers and one_spanning else "group"


def format_table(plan: JobPlan, ports: Optional[dict] = None) -> str:
    """What will run where, printed before anything starts."""
    ports = ports or {}
    mode = ("pure MPI (one mpirun, no scheduler, no servers)" if plan.num_servers == 0 else
            f"{plan.num_clients} client group(s) + {plan.num_servers} parameter server(s)")
    lines = [f"{plan.spec.num_workers} workers = {plan.num_clients} client group(s) x "
             f"{plan.workers_per_client} workers; {mode}; launcher {plan.spec.launcher}",
             f"{'process':<14}{'host':<18}{'workers':<10}{'details'}"]
    if plan.scheduler_host:
        lines.append(f"{'scheduler':<14}{plan.scheduler_host:<18}{'-':<10}"
                     f"port {ports.get('scheduler', '?')}")
    for i, host in enumerate(plan.server_hosts):
        lines.append(f"{f'server {i}':<14}{host:<18}{'-':<10}ps-lite picks its port")
    for c in plan.clients:
        where = ",".join(f"{h}:{k}" for h, k in c.ranks)
        role = ("mpirun; its rank 0 is the master (ps-lite worker)" if plan.num_servers
                else "mpirun")
        lines.append(f"{f'client {c.client}':<14}{where:<18}{c.size:<10}{role}")
    if plan.spec.row_masters == "host":
        lines.append(f"rows aggregated per host: each host's first rank is a ps-lite worker "
                     f"({plan.ps_workers} in all); global ranks are the mpirun's")
    elif plan.num_servers:
        lines.append("global ranks follow the order ps-lite's scheduler gives the masters")
    return "\n".join(lines)
