"""A bucket's SGD update as one operator over one flat array, instead of MXNet's Updater.

MXNet's ``Updater`` updates a bucket's keys with ``multi_sgd_mom_update``, four keys per
operator, after Python work per key (its states, their devices, the dtypes, the chunks):
on an NMT step that was 0.17 ms of the caller's thread, the largest piece of a dense
pushpull. The bucket's gradients already lie back to back in its buffer; with its
weights and momenta laid out the same way (each key's ``slot.value`` and its Updater
state become views of one buffer each), one ``sgd_mom_update`` over the buffers makes the
same update of every element: ``multi_sgd_mom_update`` applies that very formula per key.

Only where the result is the same: MXNet's own ``SGD`` (not a subclass, whose update may
differ), no float16 master weights (``multi_precision``), weights of the bucket's dtype
beside its buffer. Keys whose learning rate or weight decay differ (weight decay is 0 for
biases) are updated in runs of equal ones. The Updater's bookkeeping is kept: update
counts (learning-rate schedules), its ``states`` (the views: ``save_optimizer_states``
saves them, and states loaded in their place are copied in at the next step).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..tensor_collectives.operators import Operator
from .keys import Key, KeySlot


def fits(updater, slots: Sequence[KeySlot], grads: NDArray) -> bool:
    """Whether ``FlatSGD`` makes ``updater``'s update of these keys, whose summed gradients
    lie back to back in ``grads`` (the bucket's buffer)."""
    if type(updater) is not mx.optimizer.Updater or not slots:
        return False
    opt = updater.optimizer
    dtype = np.dtype(grads.dtype)
    return (type(opt) is mx.optimizer.SGD
            and not (opt.multi_precision and dtype == np.float16)
            and dtype in (np.float16, np.float32, np.float64)
            and all(s.value is not None and s.value.stype == "default"
                    and np.dtype(s.value.dtype) == dtype and s.value.context == grads.context
                    for s in slots))


class FlatSGD:
    """The weights and momenta of one bucket's keys in one buffer each (see module)."""

    def __init__(self, updater, keys: List[Key], slots: List[KeySlot], grads: NDArray):
        self.updater, self.opt = updater, updater.optimizer
        self.keys = keys
        count = sum(s.count for s in slots)
        self.grads = grads.reshape((count,))
        self.momentum = self.opt.momentum > 0
        self.weights = mx.nd.empty((count,), ctx=grads.context, dtype=grads.dtype)
        self.moms = mx.nd.zeros((count,), ctx=grads.context, dtype=grads.dtype) \
            if self.momentum else None
        self.bounds: List[int] = [0]
        for s in slots:
            self.bounds.append(self.bounds[-1] + s.count)
        self._operators: Dict[Tuple[int, int, tuple], Operator] = {}
        self.states: List[Optional[NDArray]] = []
        for n, (key, slot) in enumerate(zip(keys, slots)):
            a, b = self.bounds[n], self.bounds[n + 1]
            view = self.weights[a:b].reshape(slot.shape)
            slot.value.copyto(view)
            slot.value = view   # (the bucket checks each step that it still is: overlap.py)
            state = None
            if self.momentum:
                state = self.moms[a:b].reshape(slot.shape)
                old = updater.states.get(key)
                if isinstance(old, NDArray) and old.shape == state.shape:
                    old.copyto(state)   # (states loaded, or made by an earlier path)
            updater.states[key] = state
            updater.states_synced[key] = True
            self.states.append(state)

    def current(self) -> bool:
        """Whether the states still hold: the same optimizer and momentum setting, every
        key's state the view made here (``load_optimizer_states`` replaces them). The
        weights' views are the bucket's to check (``overlap._Weights.current``)."""
        states = self.updater.states
        return (self.updater.optimizer is self.opt and (self.opt.momentum > 0) == self.momentum
                and all(states.get(k) is st for k, st in zip(self.keys, self.states)))

    def update(self) -> None:
        """One step of SGD over the bucket, as ``SGD._update_impl`` makes it."""
        opt = self.opt
        opt._update_count(self.keys)
        lrs, wds = opt._get_lrs(self.keys), opt._get_wds(self.keys)
        params = {"rescale_grad": opt.rescale_grad}
        if self.momentum:
            params["momentum"] = opt.momentum
        if opt.clip_gradient:
            params["clip_gradient"] = opt.clip_gradient
        start = 0
        for n in range(1, len(self.keys) + 1):   # runs of keys with one lr and wd
            if n < len(self.keys) and lrs[n] == lrs[start] and wds[n] == wds[start]:
                continue
            self._operator(self.bounds[start], self.bounds[n], tuple(params))(
                lr=lrs[start], wd=wds[start], **params)
            start = n

    def _operator(self, a: int, b: int, names: tuple) -> Operator:
        """The update of elements [a, b), its arrays laid out once (``Operator``)."""
        got = self._operators.get((a, b, names))
        if got is None:
            whole = a == 0 and b == self.bounds[-1]
            w, g, m = (None if x is None else (x if whole else x[a:b])
                       for x in (self.weights, self.grads, self.moms))
            start = dict.fromkeys(("lr", "wd") + names, 0.0)
            got = self._operators[(a, b, names)] = (
                Operator("sgd_mom_update", [w, g, m], [w], **start) if m is not None
                else Operator("sgd_update", [w, g], [w], **start))
        return got
