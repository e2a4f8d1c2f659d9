"""``DistributedTrainer``: a ``gluon.Trainer`` that hands the store a whole step at once.

``gluon.Trainer`` calls ``pushpull`` once per parameter, so each small key pays a
full allreduce. This Trainer sends every dense gradient of a step in one call
with a list of keys, which the store sums in fused buckets
(``KVHYBRID_FUSION_THRESHOLD`` bytes each, Horovod's tensor fusion). Results
are the same as with ``gluon.Trainer``; sparse gradients go as before.

    trainer = kvhybrid.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
"""
from __future__ import annotations

from typing import Optional, Union

import mxnet as mx
from mxnet import gluon

from ..errors import KeyValueError
from .store import HybridMPIStore, TYPE


class DistributedTrainer(gluon.Trainer):
    """``gluon.Trainer`` over a hybrid-mpi store, with one fused store call per step."""

    def __init__(self, params, optimizer, optimizer_params: Optional[dict] = None,
                 kvstore: Union[HybridMPIStore, str] = TYPE, **kwargs):
        if isinstance(kvstore, str):
            kvstore = mx.kv.create(kvstore)
        if not isinstance(kvstore, HybridMPIStore):
            raise KeyValueError(f"kvstore must be a hybrid-mpi store, got {type(kvstore).__name__}:"
                                " pass mx.kv.create('hybrid-mpi') (after import kvhybrid)")
        super().__init__(params, optimizer, optimizer_params, kvstore=kvstore, **kwargs)

    def _allreduce_grads(self):
        if not self._kvstore:
            return
        keys, grads, outs = [], [], []
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad_list = param.list_grad()
            if grad_list[0].stype != "default":      # as gluon.Trainer does
                self._kvstore.push(i, grad_list, priority=-i)
                if param._stype == "default":
                    pull_list = param.list_data() if self._update_on_kvstore else grad_list
                    self._kvstore.pull(i, pull_list, priority=-i,
                                       ignore_sparse=self._distributed)
                continue
            keys.append(i)
            grads.append(grad_list)
            outs.append(param.list_data())
        if not keys:
            return
        if self._update_on_kvstore:
            self._kvstore.pushpull(keys, grads, out=outs)
        else:
            self._kvstore.pushpull(keys, grads)
