"""The six training modes of MXNET-MPI §7 and how each is launched.

``dist-*`` modes are pure parameter server: every worker is its own client (a one-rank
``mpirun``) and a ps-lite worker. dist-SGD and dist-ASGD use MXNet's own ``dist_sync``
and ``dist_async`` stores, unchanged; MXNet has no elastic store, so dist-ESGD is
``hybrid-mpi-elastic`` with a client per worker. ``mpi-*`` modes put the workers into
``clients`` groups that sum gradients with MPI; only the groups' masters talk to the
servers.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    #: what ``mx.kv.create`` gets
    store: str
    #: every worker its own client (pure parameter server)
    client_per_worker: bool
    #: the servers apply each client's push on its own (no wait for the others)
    asynchronous: bool
    elastic: bool = False

    def clients(self, workers: int, groups: int) -> int:
        return workers if self.client_per_worker else groups

    def workers_per_update(self, workers: int, groups: int) -> int:
        """How many workers' gradients one optimizer step sums: the Trainer's learning
        rate is divided by it, so every mode takes steps of the same size per sample."""
        if not self.asynchronous:
            return workers
        return workers // self.clients(workers, groups)

    def launcher_args(self, workers: int, groups: int, servers: int) -> List[str]:
        return ["-n", str(workers), "--clients", str(self.clients(workers, groups)),
                "--servers", str(servers)]


MODES: Dict[str, Mode] = {m.name: m for m in [
    Mode("dist-SGD", "dist_sync", client_per_worker=True, asynchronous=False),
    Mode("dist-ASGD", "dist_async", client_per_worker=True, asynchronous=True),
    Mode("dist-ESGD", "hybrid-mpi-elastic", client_per_worker=True, asynchronous=True, elastic=True),
    Mode("mpi-SGD", "hybrid-mpi", client_per_worker=False, asynchronous=False),
    Mode("mpi-ASGD", "hybrid-mpi-async", client_per_worker=False, asynchronous=True),
    Mode("mpi-ESGD", "hybrid-mpi-elastic", client_per_worker=False, asynchronous=True, elastic=True),
]}
