"""Keys of the store: what each holds, and turning call arguments into checked (key, arrays) pairs.

The checks here are local (this rank's arguments only). They raise
:class:`KeyValueError`; the store passes the message through
:func:`agreement.agree` so that every rank raises it together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..errors import KeyValueError

Key = Union[int, str]
Arrays = List[NDArray]
#: the start of the str keys kvhybrid itself puts in a store (``broadcast_parameters``
#: across client groups): they count for neither key type
OWN_KEYS = "kvhybrid."


def _own(key) -> bool:
    return isinstance(key, str) and key.startswith(OWN_KEYS)


def zeros(shape, ctx, dtype) -> NDArray:
    """``mx.nd.zeros``, which rejects empty shapes; an empty array needs no zeros."""
    if 0 in tuple(shape):
        return mx.nd.empty(shape, ctx=ctx, dtype=dtype)
    return mx.nd.zeros(shape, ctx=ctx, dtype=dtype)


@dataclass
class KeySlot:
    """What the store holds for one key: its shape and dtype, and its current value."""

    shape: Tuple[int, ...]
    dtype: np.dtype
    value: Optional[NDArray]            # the store's copy (weights when it owns the optimizer);
                                        # None for a sparse weight held by the servers
    grad: Optional[NDArray] = None      # reduction buffer for push with an optimizer
    sparse_weight: bool = False         # initialised with a row_sparse table (SparseEmbedding)
    rows_on_servers: bool = False       # its rows live on the parameter servers (see sparse.py)
    route: Optional[str] = None         # a row_sparse key's route, decided at its first push
    alpha_sum: float = 0.0              # rows touched / rows, summed over this rank's pushes
    alpha_steps: int = 0

    count: int = field(init=False)      # elements in the key
    spec: str = field(init=False)       # "shape (2, 3) float32", for signatures and errors

    def __post_init__(self):
        self.count = math.prod(self.shape)
        self.spec = f"shape {self.shape} {self.dtype.name}"

    @property
    def alpha(self) -> float:
        """Parallax's α as this rank saw it: the mean fraction of rows a push touched."""
        return self.alpha_sum / self.alpha_steps if self.alpha_steps else 0.0

    def grad_buffer(self) -> NDArray:
        if self.grad is None:
            self.grad = zeros(self.shape, self.value.context, self.dtype)
        return self.grad


def spec(arr: NDArray) -> str:
    stype = "" if arr.stype == "default" else f" {arr.stype}"
    return f"shape {tuple(arr.shape)} {np.dtype(arr.dtype).name}{stype}"


def is_key(key) -> bool:
    """Whether ``key`` is a store key (an int or a str; not a bool)."""
    return not isinstance(key, bool) and isinstance(key, (int, str, np.integer))


def check_key(key) -> Key:
    if not is_key(key):
        raise KeyValueError(f"key must be an int or a str, got {type(key).__name__} {key!r}")
    return int(key) if isinstance(key, np.integer) else key


def _arrays(key: Key, value, arg: str, sparse_ok: bool = False) -> Arrays:
    arrays = [value] if isinstance(value, NDArray) else value
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise KeyValueError(f"{arg} of key {key!r} must be an NDArray or a non-empty list of "
                            f"NDArrays, got {type(value).__name__}")
    for arr in arrays:
        if not isinstance(arr, NDArray):
            raise KeyValueError(f"{arg} of key {key!r} must hold NDArrays, got {type(arr).__name__}")
        if arr.stype != "default" and not (sparse_ok and arr.stype == "row_sparse"):
            raise KeyValueError(f"{arg} of key {key!r} is {arr.stype}: hybrid-mpi takes "
                                "row_sparse arrays in init (sparse weights), push (sparse "
                                "gradients) and row_sparse_pull only; pass default-storage "
                                "arrays here")
    first = arrays[0]
    for arr in arrays[1:]:
        if arr.shape != first.shape or arr.dtype != first.dtype or arr.stype != first.stype:
            raise KeyValueError(f"{arg} of key {key!r} mixes {spec(first)} and {spec(arr)}: "
                                "every device's copy of a key must have the same shape and dtype")
    return list(arrays)


def pairs(key, value, arg: str = "value", sparse_ok: bool = False) -> List[Tuple[Key, Arrays]]:
    """``[(key, [arrays])]`` from MXNet's ``key, value`` conventions (one key or a list)."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise KeyValueError(f"a list of {len(key)} keys needs a list of {len(key)} {arg}s, "
                                f"got {type(value).__name__}"
                                + (f" of length {len(value)}" if isinstance(value, (list, tuple))
                                   else ""))
        keys = [check_key(k) for k in key]
        values = list(value)
    else:
        keys, values = [check_key(key)], [value]
    if len(set(keys)) != len(keys):
        raise KeyValueError(f"keys {keys} repeat a key: pass each key once per call")
    return [(k, _arrays(k, v, arg, sparse_ok)) for k, v in zip(keys, values)]


def only_row_sparse(out) -> bool:
    """Whether ``out`` (an array, or a list of arrays or of lists of them) holds row_sparse
    arrays only: a ``pull`` with ``ignore_sparse`` then reads nothing, as in MXNet's stores."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    flat = [a for o in outs for a in (o if isinstance(o, (list, tuple)) else [o])]
    return bool(flat) and all(isinstance(a, NDArray) and a.stype == "row_sparse" for a in flat)


def first_key(keys) -> Optional[Key]:
    """The first of ``keys`` that sets a store's key type (kvhybrid's own keys do not)."""
    return next((k for k in keys if not _own(k)), None)


class Slots(Dict[Key, KeySlot]):
    """A store's keys, and the first that set their type (``first``: int or str)."""

    first: Optional[Key] = None

    def __setitem__(self, key: Key, slot: KeySlot) -> None:
        if self.first is None and not _own(key):
            self.first = key
        super().__setitem__(key, slot)


def check_key_types(first: Optional[Key], keys: Sequence[Key]) -> None:
    """New keys of a store whose first key is ``first`` (None: it has none yet): all of its
    type (``check_key_type``), and of one type among themselves."""
    first = first if first is not None else first_key(keys)
    for key in keys:
        check_key_type(first, key)


def check_key_type(first: Optional[Key], key: Key) -> None:
    """A store's keys are all ints or all strs, as in MXNet's stores (``test_invalid_pull``):
    a key of the other type than the store's ``first`` is refused, not taken as a new key."""
    if _own(key):
        return
    if first is not None and isinstance(first, str) != isinstance(key, str):
        kind = "str" if isinstance(first, str) else "int"
        raise KeyValueError(f"key {key!r} is {'a str' if isinstance(key, str) else 'an int'}, "
                            f"but this store's keys are {kind}s (the first: {first!r}): a "
                            f"store takes keys of one type, as MXNet's stores do; use {kind} "
                            "keys")


def lookup(slots: Dict[Key, KeySlot], key: Key) -> KeySlot:
    slot = slots.get(key)
    if slot is None:
        check_key_type(getattr(slots, "first", None) or first_key(slots), key)
        known = sorted(map(str, slots))[:8]
        raise KeyValueError(f"key {key!r} was never initialised: call init({key!r}, value) or "
                            f"broadcast({key!r}, value, out) on every rank first"
                            + (f" (known keys: {', '.join(known)}{'...' if len(slots) > 8 else ''})"
                               if slots else ""))
    return slot


def check_matches(key: Key, slot: KeySlot, arrays: Sequence[NDArray], arg: str) -> None:
    arr = arrays[0]
    if tuple(arr.shape) != slot.shape or np.dtype(arr.dtype) != slot.dtype:
        raise KeyValueError(f"{arg} of key {key!r} has {spec(arr)}, but the key was initialised "
                            f"with shape {slot.shape} {slot.dtype.name}: pass arrays of the "
                            "initialised shape and dtype")


def check_pull_out(key: Key, slot: KeySlot, arrays: Sequence[NDArray]) -> None:
    """A pull's outs need the key's shape; their dtype is theirs: the values are cast into
    it, as MXNet's stores do (a float16 key pulled into float32 arrays)."""
    for arr in arrays:
        if tuple(arr.shape) != slot.shape:
            raise KeyValueError(f"out of key {key!r} has {spec(arr)}, but the key was "
                                f"initialised with shape {slot.shape} {slot.dtype.name}: pass "
                                "out arrays of the initialised shape (any dtype: the values "
                                "are cast into it)")


def check_out(key: Key, value: Sequence[NDArray], out: Sequence[NDArray]) -> None:
    if len(out) != len(value):
        raise KeyValueError(f"out of key {key!r} has {len(out)} array(s) but value has "
                            f"{len(value)}: pass one out array per value array (one per device)")
    for v, o in zip(value, out):   # (another dtype is cast into, as a pull's outs)
        if o.shape != v.shape:
            raise KeyValueError(f"out of key {key!r} has {spec(o)} but value has {spec(v)}: "
                                "pass out arrays of the value's shape (any dtype: the result "
                                "is cast into it)")
