"""mpi-ESGD (MXNET-MPI §2.2): synchronous SGD inside each client group, elastic averaging
with a center variable on the parameter servers between groups.

``mx.kv.create('hybrid-mpi-elastic')`` in a job with servers. Every step, a key's
gradients are summed over the group (MPI) and the Trainer's optimizer updates the
group's weights, the same on every rank. Every ``KVHYBRID_ELASTIC_INTERVAL`` steps of a
key, the group's master pushes its weights w to the servers, which move the center
toward them (``center.py``), pulls the center w̃ back, and every rank of the group moves
its weights toward it (``client.py``). The servers run in ``dist_async`` mode: groups
never wait for each other. With a group per worker this is dist-ESGD.

Tables train like any other weight: a sparse weight (``SparseEmbedding``) or a weight with
sparse gradients (``nn.Embedding(sparse_grad=True)``) is held whole by every rank, its
touched rows are summed in the group and updated locally, and the whole table is
averaged with its center.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional

import mxnet as mx

from ..config import StoreConfig
from ..errors import ConfigError, KeyValueError
from ..kvstore.keys import Key, KeySlot, zeros
from ..kvstore.registry import ELASTIC_TYPE
from ..kvstore.store import HybridMPIStore
from ..tensor_collectives import broadcast_array
from .center import center_optimizer
from .client import pull_toward_center

log = logging.getLogger("kvhybrid")



class HybridMPIElasticStore(HybridMPIStore):
    """mpi-ESGD; see the module docstring."""

    SERVER_MODE = "dist_async"
    #: each key's update is followed by its exchange with the center (_count_step)
    ENGINE_PATH = False

    def __init__(self, config: Optional[StoreConfig] = None):
        config = config or StoreConfig.from_env()
        if config.num_servers == 0:
            raise ConfigError("hybrid-mpi-elastic keeps the center variables on parameter "
                              "servers, and this job has none: start it with servers "
                              "(kvhybrid-launch --servers 1 or more), or use hybrid-mpi")
        # one call per key: the exchange happens where each key is updated
        super().__init__(dataclasses.replace(config, fusion_threshold=0))
        self._sum_across_groups = False   # groups meet through the centers, never sum
        self.alpha = config.elastic_alpha or 0.9 / self._num_clients
        self.interval = config.elastic_interval
        self._steps: Dict[Key, int] = {}
        self._centers: Dict[Key, mx.nd.NDArray] = {}
        self._sent: Dict[Key, mx.nd.NDArray] = {}
        #: center exchanges made, per key, and the distance |w − w̃| before and after the
        #: last one of each key (for tests and logs)
        self.exchanges: Dict[Key, int] = {}
        self.distances: Dict[Key, List[float]] = {}
        log.info("kvhybrid: elastic averaging with the center every %d steps, alpha %.3f",
                 self.interval, self.alpha)

    @property
    def type(self) -> str:
        return ELASTIC_TYPE

    def _dense_on_servers(self) -> bool:
        return True   # each dense key's center variable, initialised from ps-lite rank 0

    def _step_counts(self) -> Dict[Key, int]:
        return self._steps   # a checkpoint saves and restores them in place

    def _server_optimizer(self, optimizer):
        return center_optimizer(self.alpha)

    def _rows_on_servers(self, slot: KeySlot) -> bool:
        return False   # every group holds its own tables, to average with their centers

    def _check_new_table(self, key: Key, value: mx.nd.NDArray) -> None:
        if self._servers is not None:   # its center goes on the servers as a dense key
            self._servers.check_new(key)

    def _sum_and_update(self, key: Key, slot: KeySlot, arrays, target, compress: bool = True):
        if self._updater is None:
            raise KeyValueError("hybrid-mpi-elastic owns the weights: Gluon must update on the "
                                "store (update_on_kvstore=True, its default for this store) so "
                                "that set_optimizer is called before training")
        result = super()._sum_and_update(key, slot, arrays, target, compress)
        self._count_step(key, slot)
        return result

    def _push_rows(self, key: Key, slot: KeySlot, arrays) -> None:
        """A table's sparse gradients: summed and applied in the group (or, on the 'dense'
        route, by ``_sum_and_update``, which counts the step itself)."""
        super()._push_rows(key, slot, arrays)
        if slot.route != "dense":
            self._count_step(key, slot)

    def _count_step(self, key: Key, slot: KeySlot) -> None:
        steps = self._steps[key] = self._steps.get(key, 0) + 1
        if steps % self.interval == 0 and slot.count:
            self._exchange(key, slot)

    def _exchange(self, key: Key, slot: KeySlot) -> None:
        center = self._centers.get(key)
        if center is None:
            center = self._centers[key] = zeros(slot.shape, slot.value.context, slot.dtype)
        if self._servers is not None:   # Elastic1 runs on the servers as the push lands
            # a copy: MXNet keeps a pushed CPU array as the key's buffer and pulls into it
            sent = self._sent.get(key)
            if sent is None:
                sent = self._sent[key] = zeros(slot.shape, slot.value.context, slot.dtype)
            slot.value.copyto(sent)
            self._servers.push_pull(key, sent, center)
        broadcast_array(center, 0, self.group, name=f"the center of key {key!r}", patient=True)
        before = float(mx.nd.norm(slot.value - center).asscalar())
        pull_toward_center(slot.value, center, self.alpha)
        after = float(mx.nd.norm(slot.value - center).asscalar())
        self.exchanges[key] = self.exchanges.get(key, 0) + 1
        self.distances[key] = [before, after]
