"""A bucket's SGD update as one operator over one flat array, instead of MXNet's Updater.

MXNet's ``Updater`` updates a bucket's keys with ``multi_sgd_mom_update``, four keys per
operator, after Python work per key (its states, their devices, the dtypes, the chunks):
on an NMT step that was the largest piece of a dense pushpull on the caller's thread.
The bucket's gradients already lie back to back in its buffer; with its weights and
momenta laid out the same way (each key's ``slot.value`` and its Updater state become
views of one buffer each), one ``sgd_mom_update`` over the buffers makes the same update
of every element: ``multi_sgd_mom_update`` applies that very formula per key.

Only where the result is the same: MXNet's own ``SGD`` (not a subclass, whose update may
differ), no float16 master weights (``multi_precision``), weights of the bucket's dtype
beside its buffer. Keys whose learning rate or weight decay differ (weight decay is 0 for
biases) are updated in runs of equal ones. The Updater's bookkeeping is kept: update
counts (learning-rate schedules), its ``states`` (the views: ``save_optimizer_states``
saves them, and states loaded in their place are copied in at the next step).

Where the bucket is at most ``NATIVE_UPDATE_BYTES`` of float32 or float64 in host memory and
the C++ helper ``sgd_update.cc`` was built, the update is not an operator at all: the
caller's thread does the step's bookkeeping (``prepare``) and the bucket's allreduce, on the
communication thread, applies the same arithmetic to the same memory right after its sum
and copies the weights into their outs where those lie in host memory (overlap.py).
Pushing the operator had cost the caller's thread a submit every step.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..tensor_collectives.native import Helper
from ..tensor_collectives.ndarray_view import host_view
from ..tensor_collectives.operators import Operator
from .keys import Key, KeySlot

#: the largest bucket the communication thread updates itself (one thread, no OpenMP): a
#: larger one is MXNet's operator, which an engine worker runs beside the next bucket's
#: allreduce
NATIVE_UPDATE_BYTES = 2**20

_KERNEL_NAMES = {np.dtype(np.float32): "kvhybrid_sgd_update_f32",
                 np.dtype(np.float64): "kvhybrid_sgd_update_f64"}
_HELPER = Helper("_sgd_update", "KVHYBRID_CPP_HELPER",
                 "the store's SGD update is an MXNet operator",
                 {**{name: (None, [ctypes.c_void_p] * 3 + [ctypes.c_int64]
                            + [ctypes.c_double] * 5) for name in _KERNEL_NAMES.values()},
                  "kvhybrid_copy_pieces": (None, [ctypes.c_void_p] * 3 + [ctypes.c_int64])},
                 package="kvhybrid.kvstore")


def _helper() -> Optional[ctypes.CDLL]:
    return _HELPER.library()


def native_kernel(dtype) -> Optional[Callable]:
    """The C++ helper's SGD update for ``dtype`` (float32, float64), or None where it was
    not built, is switched off (``KVHYBRID_CPP_HELPER=0``) or has none for the dtype."""
    name = _KERNEL_NAMES.get(np.dtype(dtype))
    lib = _helper()
    return None if lib is None or name is None else getattr(lib, name)


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

    def __init__(self, updater, keys: List[Key], slots: List[KeySlot], grads: NDArray,
                 grads_view: Optional[np.ndarray] = None):
        """``grads_view``: a host view of ``grads`` (its memory allocated), where the
        update may be the C++ helper's (``prepare``); None: operators only."""
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
        #: bytes per element (looked up once: an NDArray's dtype is a call into MXNet)
        self.itemsize = np.dtype(grads.dtype).itemsize
        #: the C++ update where it applies (see module), with the buffers' addresses
        self.kernel = native_kernel(grads.dtype) \
            if grads_view is not None and grads_view.nbytes <= NATIVE_UPDATE_BYTES else None
        self._addresses: Tuple[int, int, Optional[int]] = (0, 0, None)
        #: (the outs' views, their addresses, the keys' byte bounds): ``copy_after``
        self._copies: Optional[tuple] = None
        if self.kernel is not None:
            # wait once: the copies above write them, and MXNet may allocate late
            self.weights.wait_to_read()
            moms = None
            if self.moms is not None:
                self.moms.wait_to_read()
                moms = host_view(self.moms, grads.dtype, count).ctypes.data
            self._addresses = (host_view(self.weights, grads.dtype, count).ctypes.data,
                               grads_view.ctypes.data, moms)

    def copy_after(self, outs: Sequence[np.ndarray]) -> None:
        """Have each step's update (``prepare``) then copy key n's updated weights into
        ``outs[n]`` (host views, C-contiguous, of the key's elements each; the caller
        declares their arrays written). Only where ``kernel`` is set."""
        if self.kernel is None or len(outs) != len(self.keys) or any(
                o.nbytes != (b - a) * self.itemsize or not o.flags.c_contiguous
                for o, a, b in zip(outs, self.bounds, self.bounds[1:])):
            raise ValueError("copy_after needs the C++ update and one contiguous host view "
                             "of each key's elements")
        self._copies = (list(outs),   # (held: their memory must outlive the addresses)
                        (ctypes.c_void_p * len(outs))(*[o.ctypes.data for o in outs]),
                        (ctypes.c_int64 * len(self.bounds))(
                            *[b * self.itemsize for b in self.bounds]))

    @property
    def buffers(self) -> List[NDArray]:
        """What the update writes besides the bucket: the weights and the momenta."""
        return [self.weights] + ([self.moms] if self.moms is not None else [])

    def current(self) -> bool:
        """Whether the states still hold: the same optimizer and momentum setting, every
        key's state the view made here (``load_optimizer_states`` replaces them). The
        weights' views are the bucket's to check (``overlap._Weights.current``)."""
        states = self.updater.states
        return (self.updater.optimizer is self.opt and (self.opt.momentum > 0) == self.momentum
                and all(states.get(k) is st for k, st in zip(self.keys, self.states)))

    def update(self) -> None:
        """One step of SGD over the bucket, as ``SGD._update_impl`` makes it: its operators
        pushed into MXNet's engine."""
        params = self._params()
        for a, b, lr, wd in self._runs():
            self._operator(a, b, tuple(params))(lr=lr, wd=wd, **params)

    def prepare(self) -> Callable[[], None]:
        """One step's bookkeeping, on the caller's thread (update counts, learning rates),
        and the step's update itself, returned for whoever holds the bucket's buffers next
        (the bucket's allreduce, which mutates ``buffers``: overlap.py): the C++ helper's
        arithmetic on them, in place. Only where ``kernel`` is set."""
        runs, params = self._runs(), self._params()
        rescale = float(params["rescale_grad"])
        momentum = float(params.get("momentum", 0.0))
        clip = float(params.get("clip_gradient", -1.0))
        kernel, size = self.kernel, self.itemsize
        weights, grads, moms = self._addresses
        copies, count = self._copies, len(self.keys)

        def apply() -> None:
            for a, b, lr, wd in runs:
                kernel(weights + a * size, grads + a * size,
                       None if moms is None else moms + a * size, b - a, lr, wd, rescale,
                       momentum, clip)
            if copies is not None:
                _helper().kvhybrid_copy_pieces(weights, copies[1], copies[2], count)

        return apply

    def _runs(self) -> List[Tuple[int, int, float, float]]:
        """The step's update counts (learning-rate schedules count them), and its runs of
        keys with one learning rate and weight decay: (first element, end, lr, wd)."""
        opt = self.opt
        opt._update_count(self.keys)
        lrs, wds = opt._get_lrs(self.keys), opt._get_wds(self.keys)
        runs, start = [], 0
        for n in range(1, len(self.keys) + 1):
            if n < len(self.keys) and lrs[n] == lrs[start] and wds[n] == wds[start]:
                continue
            runs.append((self.bounds[start], self.bounds[n], float(lrs[start]),
                         float(wds[start])))
            start = n
        return runs

    def _params(self) -> dict:
        """The operator's parameters shared by every key (as ``SGD._update_impl``)."""
        opt = self.opt
        params = {"rescale_grad": opt.rescale_grad}
        if self.momentum:
            params["momentum"] = opt.momentum
        if opt.clip_gradient:
            params["clip_gradient"] = opt.clip_gradient
        return params

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
