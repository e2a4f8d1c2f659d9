"""MXNet operators pushed to the engine with their C arguments laid out once.

MXNet's Python operator functions (``mx.nd.sgd_update``, ``copyto``, ...) build the C
arrays of input and output handles and of parameter strings, look the operator up and
wrap its outputs on every call: tens of µs of the caller's thread under load, where the
push itself (``MXImperativeInvokeEx``) costs a few. A store repeats the same operators on
the same arrays every step, so ``Operator`` builds those arrays once and each call is the
push alone. What the engine runs, and in what order, is exactly what the Python function
would have pushed.
"""
from __future__ import annotations

import ctypes
from typing import Dict, Sequence

from mxnet.base import _LIB, NDArrayHandle, c_str, check_call
from mxnet.ndarray import NDArray

from .ndarray_view import engine_copy

_OP_HANDLES: Dict[str, ctypes.c_void_p] = {}


def _op_handle(name: str) -> ctypes.c_void_p:
    handle = _OP_HANDLES.get(name)
    if handle is None:
        handle = ctypes.c_void_p()
        if _LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)) != 0 or not handle.value:
            raise ValueError(f"MXNet has no operator named {name!r}")
        _OP_HANDLES[name] = handle
    return handle


def _handles(arrays: Sequence[NDArray]):
    return (NDArrayHandle * len(arrays))(*[a.handle for a in arrays])


def _push(op, inputs, n_inputs: int, outputs, n_outputs: int, n_params: int = 0,
          keys=None, vals=None) -> None:
    """``MXImperativeInvokeEx`` with given outputs (``out=``): what MXNet's Python
    functions push, and all an ``Operator`` call or a ``copy`` does."""
    check_call(_LIB.MXImperativeInvokeEx(
        op, n_inputs, inputs, ctypes.byref(ctypes.c_int(n_outputs)),
        ctypes.byref(ctypes.cast(outputs, ctypes.POINTER(NDArrayHandle))), n_params, keys,
        vals, ctypes.byref(ctypes.POINTER(ctypes.c_int)())))


class Operator:
    """One MXNet operator over fixed ``inputs`` writing fixed ``outputs`` (as ``out=``),
    pushed by calling it. Parameters are given as MXNet's Python functions take them; a
    call may change their values (a learning rate schedule), not their names."""

    def __init__(self, name: str, inputs: Sequence[NDArray], outputs: Sequence[NDArray],
                 **params):
        if not outputs:
            raise ValueError(f"operator {name!r} needs its outputs given")
        self.name = name
        self._op = _op_handle(name)
        self._arrays = list(inputs) + list(outputs)   # (held: their handles must outlive it)
        self._inputs = _handles(inputs)
        self._outputs = _handles(outputs)
        self._n_inputs, self._n_outputs = len(inputs), len(outputs)
        self._names = list(params)
        self._name_set = frozenset(params)
        self._keys = (ctypes.c_char_p * len(params))(*[k.encode() for k in params])
        self._params: tuple = ()
        self._vals = None
        self._set(tuple(params.values()))

    def _set(self, values: tuple) -> None:
        self._params = values
        self._vals = (ctypes.c_char_p * len(values))(*[str(v).encode() for v in values])

    def __call__(self, **params) -> None:
        """Push the operator; ``params``: new values of some of its parameters."""
        if params:
            if not params.keys() <= self._name_set:
                unknown = sorted(set(params) - self._name_set)
                raise ValueError(f"operator {self.name!r} was built without parameter(s) "
                                 f"{unknown}: build it with them")
            values = tuple(params.get(n, v) for n, v in zip(self._names, self._params))
            if values != self._params:
                self._set(values)
        _push(self._op, self._inputs, self._n_inputs, self._outputs, self._n_outputs,
              len(self._names), self._keys, self._vals)


def copy(src: NDArray, dst: NDArray) -> None:
    """``src.copyto(dst)`` for two arrays of the same shape (any storage), without the
    Python wrapper's cost; for a pair used once (no ``Operator`` built). Through the C++
    helper's ``CopyFromTo`` where it runs, else the ``_copyto`` operator."""
    if engine_copy(src, dst):
        return
    _push(_op_handle("_copyto"), (NDArrayHandle * 1)(src.handle), 1,
          (NDArrayHandle * 1)(dst.handle), 1)
