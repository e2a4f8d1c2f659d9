"""``DistributedTrainer``: a ``gluon.Trainer`` that hands the store a whole step at once.

``gluon.Trainer`` calls ``pushpull`` once per parameter, so each small key pays a
full allreduce. This Trainer sends every dense gradient of a step in one call
with a list of keys, which the store sums in fused buckets
(``KVHYBRID_FUSION_THRESHOLD`` bytes each, Horovod's tensor fusion). Results
are the same as with ``gluon.Trainer``; sparse gradients go as before.

Two more things make the fused step cheap, as PyTorch DDP does:

- the dense gradients of each device live in one buffer per dtype (Gluon's
  gradient arrays become views into it), so a bucket is summed where backward
  wrote it, with no copy in or out;
- with one client group and no sparse parameters it updates locally
  (``update_on_kvstore=False``, as Horovod's ``DistributedTrainer``): the store
  sums in place and every rank applies the same update. Pass
  ``update_on_kvstore=True`` to update on the store instead.

    trainer = kvhybrid.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Union

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

from ..errors import KeyValueError
from ..kvstore import overlap
from ..kvstore.registry import TYPE
from ..kvstore.store import HybridMPIStore


def prefetch(trainer: gluon.Trainer, rows: Mapping[gluon.Parameter, object]) -> None:
    """Hand a hybrid-mpi store the row ids the next forward pass reads of each sparse table
    (``{embedding.weight: next_batch_ids}``; NDArrays or numpy, on every rank, before
    ``trainer.step``): their rows are fetched while this step finishes, and the next
    forward pass takes them without meeting the other ranks. A no-op for other stores
    and for tables whose rows do not live on parameter servers."""
    if not trainer._kv_initialized:   # nothing held yet (the first step creates the store,
        return                         # and must: it sets the optimizer's rescale_grad)
    store = trainer._kvstore
    if not isinstance(store, HybridMPIStore):
        return
    for param, ids in rows.items():
        if param.name not in trainer._param2idx:
            raise KeyValueError(f"prefetch got Parameter {param.name!r}, which this Trainer "
                                "does not train: pass the tables it was given")
        store.prefetch_rows(trainer._param2idx[param.name], ids)


class DistributedTrainer(gluon.Trainer):
    """``gluon.Trainer`` over a hybrid-mpi store, with one fused store call per step."""

    def __init__(self, params, optimizer, optimizer_params: Optional[dict] = None,
                 kvstore: Union[HybridMPIStore, str] = TYPE, **kwargs):
        if isinstance(kvstore, str):
            kvstore = mx.kv.create(kvstore)
        if not isinstance(kvstore, HybridMPIStore):
            raise KeyValueError(f"kvstore must be a hybrid-mpi store, got {type(kvstore).__name__}:"
                                " pass mx.kv.create('hybrid-mpi') (after import kvhybrid)")
        plist = list(params.values()) if hasattr(params, "values") else list(params)
        sparse = any(p._stype != "default" or p._grad_stype != "default" for p in plist)
        if kwargs.get("update_on_kvstore") is None and not sparse and \
                kvstore.num_workers == kvstore.group.size:
            kwargs["update_on_kvstore"] = False
        super().__init__(params, optimizer, optimizer_params, kvstore=kvstore, **kwargs)
        self._bucketed = False

    def prefetch(self, rows: Mapping[gluon.Parameter, object]) -> None:
        """``kvhybrid.prefetch(self, rows)``: hand over the next batch's row ids."""
        prefetch(self, rows)

    def _dense_order(self) -> List[int]:
        """The order the store gets the dense keys in: on the engine path last parameter
        first (the order backward writes gradients), else the parameters' order."""
        dense = [i for i, p in enumerate(self._params) if p.grad_req != "null"
                 and p._stype == "default" and p._grad_stype == "default"]
        return dense[::-1] if self._kvstore.engine_bucket_bytes else dense

    def _layout(self, dense) -> List[List]:
        """The parameters whose gradients share one buffer: on the engine path one buffer
        per bucket of the store's plan (the engine sees a buffer as one array, so a bucket
        is ready when backward has written all of it, and not before the rest), else one
        per dtype."""
        bucket_bytes = self._kvstore.engine_bucket_bytes
        if bucket_bytes:
            return [[dense[i] for i in idx] for idx in overlap.bucket_indices(
                [p._grad[0].size * np.dtype(p.dtype).itemsize for p in dense],
                [np.dtype(p.dtype) for p in dense], bucket_bytes)]
        by_dtype = {}
        for p in dense:
            by_dtype.setdefault(np.dtype(p.dtype), []).append(p)
        return list(by_dtype.values())

    def _grads_into_buckets(self) -> None:
        """Make each device's dense gradients views into shared buffers, in the order the
        store sees the keys, so that buckets lie contiguous in memory and are summed where
        backward wrote them (PyTorch DDP's gradient-as-bucket-view)."""
        dense = [self._params[i] for i in self._dense_order()]
        dense = [p for p in dense if p._grad is not None and p._grad[0].size]
        if not dense:
            return
        for d in range(len(dense[0].list_ctx())):
            for group in self._layout(dense):
                grads = [p._grad[d] for p in group]
                total = sum(g.size for g in grads)
                buf = mx.nd.zeros((total,), ctx=grads[0].context, dtype=grads[0].dtype)
                start, views = 0, []
                for p, g in zip(group, grads):
                    view = buf[start:start + g.size].reshape(g.shape)
                    g.copyto(view)
                    p._grad[d] = view
                    views.append(view)
                    start += g.size
                self._kvstore.share_gradient_buffer(buf, views)
        for p in dense:
            data = p._check_and_get(p._data, list)
            fresh = [arr._fresh_grad for arr in data]   # marking again clears the flag
            autograd.mark_variables(data, p._grad, p.grad_req)
            for arr, was in zip(data, fresh):
                arr._fresh_grad = was

    def _allreduce_grads(self):
        if not self._kvstore:
            return
        if not self._bucketed:
            self._grads_into_buckets()
            self._bucketed = True
        keys = self._dense_order()
        grads = [self._params[i].list_grad() for i in keys]
        outs = [self._params[i].list_data() for i in keys]
        dense = set(keys)
        sparse = [(i, p, p.list_grad()) for i, p in enumerate(self._params)
                  if p.grad_req != "null" and i not in dense]
        # dense keys first: their fused call waits for MXNet's engine to go idle, which a
        # row_sparse push to the servers in flight would make it wait for (a whole round)
        if keys and self._update_on_kvstore:
            self._kvstore.pushpull(keys, grads, out=outs)
        elif keys:
            self._kvstore.pushpull(keys, grads)
        # the sparse keys in one push: the store sends their rows in one meeting (gluon.Trainer
        # pushes key by key)
        if len(sparse) == 1:
            self._kvstore.push(sparse[0][0], sparse[0][2], priority=-sparse[0][0])
        elif sparse:
            self._kvstore.push([i for i, _, _ in sparse], [g for _, _, g in sparse])
        for i, param, grad_list in sparse:
            if param._stype == "default":   # as gluon.Trainer does
                pull_list = param.list_data() if self._update_on_kvstore else grad_list
                self._kvstore.pull(i, pull_list, priority=-i, ignore_sparse=self._distributed)
