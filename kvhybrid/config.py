"""Store settings, read from the environment.

``mx.kv.create('hybrid-mpi')`` passes no arguments, so everything that can be
configured comes from ``KVHYBRID_*`` variables (documented in docs/configuration.md).
Values are validated up front; a bad one raises :class:`kvhybrid.ConfigError` naming
the variable and a value that would work.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Callable, Dict, Mapping, Optional


def _refused(message: str) -> Exception:
    """The :class:`kvhybrid.errors.ConfigError` to raise. It is an ``mx.base.MXNetError``,
    so it is imported only when a value is refused: reading settings costs no MXNet import
    (the launcher checks them before starting anything)."""
    from .errors import ConfigError
    return ConfigError(message)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise _refused(f"{name}={raw!r} is not a boolean: set it to 1 or 0")


def _number(kind, allowed: Callable, fix: Callable[[str], str]) -> Callable:
    """A parser for a numeric setting: ``kind`` (int or float) converts, ``allowed(value)``
    says whether the value works, ``fix(name)`` tells the user what to set."""
    def parse(name: str, raw: str):
        try:
            value = kind(raw)
        except ValueError:
            raise _refused(f"{name}={raw!r} is not a number: {fix(name)}") from None
        if not allowed(value):
            raise _refused(f"{name}={raw!r} is out of range: {fix(name)}")
        return value
    return parse


def _max_partitions() -> int:
    from .kvstore.ps.link import MAX_PARTITIONS
    return MAX_PARTITIONS


_parse_seconds = _number(float, lambda v: v > 0, lambda n: f"set it to seconds > 0, e.g. {n}=300")
_parse_positive = _number(float, lambda v: v > 0, lambda n: f"set it to a number > 0, e.g. {n}=1")
_parse_fraction = _number(float, lambda v: 0 < v < 1,
                          lambda n: f"it must lie strictly between 0 and 1, e.g. {n}=0.5")
_parse_interval = _number(int, lambda v: v >= 1,
                          lambda n: f"set it to a whole number of steps >= 1, e.g. {n}=64")
_parse_count = _number(int, lambda v: v >= 0, lambda n: "set it to an integer >= 0")
_parse_partitions = _number(
    int, lambda v: 1 <= v <= _max_partitions(),
    lambda n: f"a table is split into 1 to {_max_partitions()} pieces; set e.g. {n}=4 (1: no split)")


def _parse_algorithm(name: str, raw: str) -> str:
    from .tensor_collectives.algorithms import ALGORITHMS
    value = raw.strip().lower()
    if value != "auto" and value not in ALGORITHMS:
        raise _refused(f"{name}={raw!r} is not an allreduce algorithm: set it to auto or one "
                          f"of {', '.join(ALGORITHMS)}")
    return value


#: who pushes a client group's rows to the servers (KVHYBRID_ROW_MASTERS)
ROW_MASTERS = ("group", "host")


def _parse_row_masters(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in ROW_MASTERS:
        raise _refused(f"{name}={raw!r}: set it to group (the group's master pushes the "
                          "group's rows) or host (each host's first rank pushes its host's rows)")
    return value


def _parse_routes(name: str, raw: str) -> Dict[str, str]:
    from .kvstore.routing import ROUTES
    routes = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, route = (x.strip() for x in item.partition("="))
        if not sep or not key or route not in ROUTES:
            raise _refused(f"{name}={raw!r}: {item!r} is not key=route; write e.g. "
                              f"{name}=embedding0_weight=dense,3=servers with a route out of "
                              f"{', '.join(ROUTES)}")
        routes[key] = route
    return routes


@dataclass(frozen=True)
class StoreConfig:
    """What a ``hybrid-mpi`` store does; one field per ``KVHYBRID_*`` variable."""

    #: KVHYBRID_TIMEOUT: seconds any blocking wait (a collective, the engine)
    #: may take before the job is aborted with a message naming the wait.
    timeout: float = 300.0
    #: KVHYBRID_STALL_WARNING: seconds after which a wait logs a warning that
    #: names the ranks that have not arrived yet.
    stall_warning: float = 60.0
    #: KVHYBRID_ABORT_ON_ERROR: an uncaught exception on one rank aborts the
    #: whole MPI job (as ``python -m mpi4py`` does) instead of leaving the
    #: other ranks waiting in a collective.
    abort_on_error: bool = True
    #: KVHYBRID_ALLOW_SINGLETON: allow a store in a process that was not
    #: started by an MPI launcher (it then is a job of one rank).
    allow_singleton: bool = False
    #: KVHYBRID_CONNECT_TIMEOUT: seconds a group master may take to join the
    #: scheduler and the servers before the job is aborted naming host:port.
    connect_timeout: float = 20.0
    #: KVHYBRID_FUSION_THRESHOLD: bytes of small dense keys that one call with a
    #: list of keys (kvhybrid.DistributedTrainer makes one per step) sums in a
    #: single allreduce; 0 turns fusion off.
    fusion_threshold: int = 64 * 2**20
    #: KVHYBRID_ENGINE: sum the dense keys of a pushpull in buckets scheduled by MXNet's
    #: engine (tensor_collectives/engine.py): each bucket's allreduce starts when
    #: backward has written it and overlaps the rest of the step. 0: the blocking path
    #: (sum after the whole backward pass, in the caller's thread).
    engine: bool = True
    #: KVHYBRID_BUCKET_BYTES: bytes of one engine bucket (after a first bucket of at most
    #: 1 MiB, PyTorch DDP's plan): smaller buckets start earlier, larger ones cost fewer
    #: collectives. Bounded by KVHYBRID_FUSION_THRESHOLD.
    bucket_bytes: int = 4 * 2**20
    #: KVHYBRID_PACK_KEYS: with several client groups and the optimizer on the servers,
    #: the small dense keys of a multi-key call travel to the servers packed into a few
    #: ps-lite keys (kvstore/ps/packs.py: ps-lite keeps memory for every request for good).
    pack_keys: bool = True
    #: KVHYBRID_ALLREDUCE: the algorithm for dense sums; auto picks one by message
    #: size and the group's hosts (tensor_collectives/algorithms.py).
    allreduce: str = "auto"
    #: KVHYBRID_EMULATE_NODE_SIZE: treat every k consecutive ranks of a host as one
    #: host, to exercise the multi-host algorithms on one machine; 0: real hosts.
    emulate_node_size: int = 0
    #: KVHYBRID_ROUTES: force where a row_sparse key's gradients go, by key or
    #: Parameter name: "embedding0_weight=dense,3=servers" (routes: servers, rows, dense).
    routes: Dict[str, str] = field(default_factory=dict)
    #: KVHYBRID_ROW_MASTERS: who aggregates a group's row_sparse gradients and talks to
    #: the servers for them: "group" (the group's master, MXNET-MPI) or "host" (each host's
    #: first rank for its host's ranks, Parallax's local aggregation; dense keys are still
    #: allreduced over the whole group). "host" needs one client group and servers.
    row_masters: str = "group"
    #: KVHYBRID_AR_EFFICIENCY: how many times faster a byte moves by allreduce than
    #: through the servers, in the routing model (kvstore/routing.py); 1: Table 3 as is.
    ar_efficiency: float = 1.0
    #: KVHYBRID_PARTITIONS: pieces (row ranges, each its own server key) a row_sparse
    #: table on the parameter servers is split into (Parallax's P; see partition_tuner.py).
    partitions: int = 1
    #: KVHYBRID_STATS_FILE: rank 0 writes its step times and row_sparse key stats here
    #: (JSON) when the store closes; kvhybrid-launch --tune-partitions reads it.
    stats_file: str = ""
    #: KVHYBRID_STATS_STEPS: rank 0 also writes the stats file once this many steps have
    #: begun (0: only at close): the tuners set it so that a trial can stop there.
    stats_steps: int = 0
    #: KVHYBRID_ELASTIC_ALPHA: the elastic force α of hybrid-mpi-elastic, in (0, 1);
    #: 0 (unset): EASGD's rule 0.9 / number of client groups.
    elastic_alpha: float = 0.0
    #: KVHYBRID_ELASTIC_INTERVAL: steps between a client group's exchanges with the center.
    elastic_interval: int = 64
    #: KVHYBRID_RESTART: set by kvhybrid-launch --restarts in a client group it restarted
    #: (the attempt, 1, 2, ...): the group rejoins ps-lite and takes the servers' current
    #: values instead of initialising them. 0: a first start.
    restart: int = 0
    #: DMLC_NUM_SERVER: MXNet parameter servers of the job (0: pure MPI).
    num_servers: int = 0
    #: DMLC_NUM_WORKER, when DMLC_ROLE=worker and there are servers: the number
    #: of ps-lite workers: client groups (one master per group), or with
    #: KVHYBRID_ROW_MASTERS=host the hosts of the one group.
    num_clients: int = 1

    _ENV = {
        "timeout": ("KVHYBRID_TIMEOUT", _parse_seconds),
        "stall_warning": ("KVHYBRID_STALL_WARNING", _parse_seconds),
        "abort_on_error": ("KVHYBRID_ABORT_ON_ERROR", _parse_bool),
        "allow_singleton": ("KVHYBRID_ALLOW_SINGLETON", _parse_bool),
        "connect_timeout": ("KVHYBRID_CONNECT_TIMEOUT", _parse_seconds),
        "fusion_threshold": ("KVHYBRID_FUSION_THRESHOLD", _parse_count),
        "engine": ("KVHYBRID_ENGINE", _parse_bool),
        "bucket_bytes": ("KVHYBRID_BUCKET_BYTES", _number(
            int, lambda v: v >= 1, lambda n: f"set it to bytes >= 1, e.g. {n}={4 * 2**20}")),
        "pack_keys": ("KVHYBRID_PACK_KEYS", _parse_bool),
        "allreduce": ("KVHYBRID_ALLREDUCE", _parse_algorithm),
        "emulate_node_size": ("KVHYBRID_EMULATE_NODE_SIZE", _parse_count),
        "routes": ("KVHYBRID_ROUTES", _parse_routes),
        "ar_efficiency": ("KVHYBRID_AR_EFFICIENCY", _parse_positive),
        "row_masters": ("KVHYBRID_ROW_MASTERS", _parse_row_masters),
        "partitions": ("KVHYBRID_PARTITIONS", _parse_partitions),
        "stats_file": ("KVHYBRID_STATS_FILE", lambda name, raw: raw.strip()),
        "stats_steps": ("KVHYBRID_STATS_STEPS", _parse_count),
        "elastic_alpha": ("KVHYBRID_ELASTIC_ALPHA", _parse_fraction),
        "elastic_interval": ("KVHYBRID_ELASTIC_INTERVAL", _parse_interval),
        "restart": ("KVHYBRID_RESTART", _parse_count),
        "num_servers": ("DMLC_NUM_SERVER", _parse_count),
        "num_clients": ("DMLC_NUM_WORKER", _parse_count),
    }

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "StoreConfig":
        env = os.environ if environ is None else environ
        values = {}
        for setting in fields(cls):
            name, parse = cls._ENV[setting.name]
            raw = env.get(name)
            if raw is not None and raw.strip() != "":
                values[setting.name] = parse(name, raw)
        if values.get("num_servers", 0) == 0 or env.get("DMLC_ROLE") != "worker":
            values["num_clients"] = 1  # DMLC_NUM_WORKER counts ps-lite workers, if any
        elif values.get("num_clients", 1) < 1:
            raise _refused("DMLC_NUM_WORKER must be the number of client groups (>= 1)")
        else:   # a master signs its commands to the servers (kvstore/ps/auth.py)
            from .kvstore.ps.auth import AuthError, job_secret
            try:
                job_secret(env)
            except AuthError as exc:
                raise _refused(str(exc)) from None
        return cls(**values)
