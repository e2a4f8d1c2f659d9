"""mpi-ESGD as a mode of the store (``kvstore/modes.py``): synchronous SGD inside each
client group, elastic averaging with a center variable on the parameter servers between
groups.

Every step, a key's gradients are summed over the group (MPI) and the Trainer's optimizer
updates the group's weights, the same on every rank. Every ``KVHYBRID_ELASTIC_INTERVAL``
steps of a key, the group's master pushes its weights w to the servers, which move the
center toward them (``center.py``), pulls the center w̃ back, and every rank of the group
moves its weights toward it (``client.py``). The servers run in ``dist_async`` mode:
groups never wait for each other. With a group per worker this is dist-ESGD.

Tables train like any other weight: a sparse weight (``SparseEmbedding``) or a weight with
sparse gradients (``nn.Embedding(sparse_grad=True)``) is held whole by every rank, its
touched rows are summed in the group and updated locally, and the whole table is
averaged with its center.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List

import mxnet as mx

from ..config import StoreConfig
from ..errors import ConfigError, KeyValueError
from ..kvstore.keys import Key, KeySlot, zeros
from ..kvstore.modes import AsyncMode
from ..kvstore.registry import ELASTIC_TYPE
from ..tensor_collectives import broadcast_array
from .center import center_optimizer
from .client import pull_toward_center

log = logging.getLogger("kvhybrid")


class ElasticMode(AsyncMode):
    """mpi-ESGD; see the module docstring."""

    store_type = ELASTIC_TYPE
    #: each key's update is followed by its exchange with the center (after_update)
    engine_path = False
    #: every group holds its own tables, to average with their centers (dense keys there)
    tables_in_groups = True

    def __init__(self):
        self._alpha = 0.0      # KVHYBRID_ELASTIC_ALPHA (0: 0.9 ÷ client groups, set at bind)
        self.alpha = 0.0
        self.interval = 0
        self._steps: Dict[Key, int] = {}
        self._centers: Dict[Key, mx.nd.NDArray] = {}
        self._sent: Dict[Key, mx.nd.NDArray] = {}
        #: center exchanges made, per key, and the distance |w − w̃| before and after the
        #: last one of each key (for tests and logs)
        self.exchanges: Dict[Key, int] = {}
        self.distances: Dict[Key, List[float]] = {}

    def configure(self, config: StoreConfig) -> StoreConfig:
        if config.num_servers == 0:
            raise ConfigError("hybrid-mpi-elastic keeps the center variables on parameter "
                              "servers, and this job has none: start it with servers "
                              "(kvhybrid-launch --servers 1 or more), or use hybrid-mpi")
        self._alpha, self.interval = config.elastic_alpha, config.elastic_interval
        # one call per key: the exchange happens where each key is updated
        return dataclasses.replace(config, fusion_threshold=0)

    def allows_host_masters(self):
        return "KVHYBRID_ROW_MASTERS=host is for the synchronous hybrid-mpi store"

    def bind(self, placement) -> None:
        super().bind(placement)
        self.alpha = self._alpha or 0.9 / placement.num_clients
        log.info("kvhybrid: elastic averaging with the center every %d steps, alpha %.3f",
                 self.interval, self.alpha)

    def sums_across_groups(self, several_groups: bool) -> bool:
        return False   # groups meet through the centers, never sum

    def dense_on_servers(self, sum_across_groups: bool) -> bool:
        return True   # each dense key's center variable, initialised from ps-lite rank 0

    def server_optimizer(self, optimizer):
        return center_optimizer(self.alpha)

    def check_update(self, has_updater: bool) -> None:
        if not has_updater:
            raise KeyValueError("hybrid-mpi-elastic owns the weights: Gluon must update on the "
                                "store (update_on_kvstore=True, its default for this store) so "
                                "that set_optimizer is called before training")

    def step_counts(self) -> Dict[Key, int]:
        return self._steps   # a checkpoint saves and restores them in place

    def after_update(self, key: Key, slot: KeySlot) -> None:
        steps = self._steps[key] = self._steps.get(key, 0) + 1
        if steps % self.interval == 0 and slot.count:
            self._exchange(key, slot)

    def _exchange(self, key: Key, slot: KeySlot) -> None:
        servers, group = self.placement.servers, self.placement.group
        center = self._centers.get(key)
        if center is None:
            center = self._centers[key] = zeros(slot.shape, slot.value.context, slot.dtype)
        if servers is not None:   # Elastic1 runs on the servers as the push lands
            # a copy: MXNet keeps a pushed CPU array as the key's buffer and pulls into it
            sent = self._sent.get(key)
            if sent is None:
                sent = self._sent[key] = zeros(slot.shape, slot.value.context, slot.dtype)
            slot.value.copyto(sent)
            servers.push_pull(key, sent, center)
        broadcast_array(center, 0, group, name=f"the center of key {key!r}", patient=True)
        before = float(mx.nd.norm(slot.value - center).asscalar())
        pull_toward_center(slot.value, center, self.alpha)
        after = float(mx.nd.norm(slot.value - center).asscalar())
        self.exchanges[key] = self.exchanges.get(key, 0) + 1
        self.distances[key] = [before, after]
