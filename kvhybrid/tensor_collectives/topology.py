"""Which ranks of a group share a host: the node communicators the shared-memory and
hierarchical allreduces run on.

``KVHYBRID_EMULATE_NODE_SIZE=k`` splits a host's ranks into "nodes" of ``k``
consecutive ranks, so that the multi-host algorithms can be exercised (and tested)
on one machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Topology:
    #: the ranks of the group on this rank's node (shared memory works among them)
    node: object
    #: one rank per node, those with this rank's index on their node; None unless
    #: every node has as many ranks (the hierarchical algorithm needs that)
    cross: object
    #: number of nodes the group spans
    nodes: int
    #: every node has the same number of ranks
    uniform: bool

    @classmethod
    def of(cls, MPI, comm, emulate_node_size: int = 0) -> "Topology":
        """Collective over ``comm``: every rank must call it at the same point."""
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        if emulate_node_size:
            real = node
            node = real.Split(color=real.Get_rank() // emulate_node_size, key=real.Get_rank())
            real.Free()
        leaders = np.array([1 if node.Get_rank() == 0 else 0], dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, leaders, op=MPI.SUM)   # not the pickled one, which holds the GIL
        nodes = int(leaders[0])
        sizes = set(comm.allgather(node.Get_size()))
        uniform = len(sizes) == 1
        cross = comm.Split(color=node.Get_rank(), key=comm.Get_rank()) if uniform else None
        return cls(node=node, cross=cross, nodes=nodes, uniform=uniform)
