"""A group of ranks that reduce tensors together: an MPI communicator plus its watchdog."""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np
import mxnet as mx

from ..config import StoreConfig
from .algorithms import Algorithms
from .mpi_env import load_mpi
from .watchdog import Watchdog, install_abort_on_uncaught_exception

log = logging.getLogger("kvhybrid")


class Group:
    """Ranks that run collectives together (the paper's client group).

    Owns a private duplicate of the communicator it is built from, so kvhybrid's
    traffic never mixes with the user's own MPI calls, and a :class:`Watchdog`
    that times every blocking wait on it.
    """

    def __init__(self, MPI, comm, config: StoreConfig, name: str):
        self.MPI = MPI
        self.comm = comm.Dup()
        self.name = name
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.config = config
        self.watchdog = Watchdog(MPI, self.comm, config.timeout, config.stall_warning, name)
        #: the allreduce algorithms and the selector between them
        self.algorithms = Algorithms(self, config.allreduce, config.emulate_node_size)
        self._staging: Dict[Tuple[int, str], mx.nd.NDArray] = {}
        #: bytes this rank has sent, by kind: "dense" and "rows" handed to MPI collectives,
        #: "servers" pushed to the parameter servers (a master's row_sparse pushes)
        self.bytes_sent: Dict[str, int] = {"dense": 0, "rows": 0, "servers": 0}
        #: fused allreduces run (one per bucket of small keys)
        self.fused_calls = 0
        #: of those, the ones reduced where the gradients lie (no copies)
        self.fused_in_place = 0

    @classmethod
    def world(cls, config: StoreConfig) -> "Group":
        """All ranks of the MPI job; raises NotInMPIJobError outside one."""
        MPI = load_mpi(config.allow_singleton)
        if config.abort_on_error:
            install_abort_on_uncaught_exception(MPI)
        return cls(MPI, MPI.COMM_WORLD, config, "world")

    def staging(self, size: int, dtype) -> mx.nd.NDArray:
        """A pinned host buffer for arrays that live on an accelerator (reused per size)."""
        key = (size, np.dtype(dtype).str)
        buf = self._staging.get(key)
        if buf is None:
            buf = mx.nd.empty((size,), ctx=mx.cpu_pinned(0), dtype=dtype)
            self._staging[key] = buf
        return buf

    def close(self) -> None:
        self.watchdog.close()
        self._staging.clear()
        # The communicator is not freed here: MPI_Comm_free is collective, and a
        # close() that only some ranks reach must not block; MPI_Finalize frees it.

    def __repr__(self) -> str:
        return f"Group({self.name!r}, rank={self.rank}, size={self.size})"
