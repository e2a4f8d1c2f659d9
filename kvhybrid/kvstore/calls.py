"""Calls: each store call's local checks, the agreement of every rank on it, and the memo
of repeated pushpull calls.

Every call that leads to a collective is agreed first (``agreement.py``): one small
allreduce tells every rank whether all ranks made the same call and none failed its local
checks, so a bad argument raises the same error on every rank before anything changed,
instead of leaving the other ranks in a collective alone. A training loop repeats the same
pushpull with the same arrays every step; its checks run once (the memo) and only the
agreement runs again, on the engine's communication thread when the dense path runs there.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from mxnet.base import _LIB, check_call
from mxnet.ndarray import NDArray

from ..errors import KeyValueError
from ..tensor_collectives import Group
from ..tensor_collectives.fusion import on_host
from .agreement import agree
from .keys import Key, KeySlot, check_matches, check_out, lookup, pairs, spec

#: checked pushpull calls remembered per store
MEMO_LIMIT = 4096


def unrecorded(method):
    """Gluon calls the store inside ``autograd.record()`` (a sparse weight's first forward
    pass initialises the Trainer's store); the store's writes into weights are not part of
    the model's graph, as with MXNet's own stores, which write from C++."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        # (mx.autograd.pause() without its scope object: the recording flag only, set and
        # put back, 2 calls into MXNet where it makes 4; the train mode is not read here)
        was = ctypes.c_int()
        check_call(_LIB.MXAutogradSetIsRecording(0, ctypes.byref(was)))
        try:
            return method(*args, **kwargs)
        finally:
            if was.value:
                check_call(_LIB.MXAutogradSetIsRecording(1, ctypes.byref(was)))
    return wrapper


def call_key(key):
    """A key argument (an int, a str or a list of them) as a dictionary key."""
    return tuple(key) if isinstance(key, list) else key


def _handles(arrays):
    """Which arrays a value/out argument (nested lists) names, for call memos: their ids
    (a memo holds the arrays of the calls it remembers, so no other object takes one of
    those ids meanwhile; the same NDArray object is the same array)."""
    if isinstance(arrays, NDArray):
        return id(arrays)
    if isinstance(arrays, (list, tuple)):
        return tuple([id(a) if isinstance(a, NDArray) else _handles(a) for a in arrays])
    return type(arrays).__name__


def keys_text(pairs_) -> str:
    """``key 3 shape (2, 3) float32, ...``: a call's keys, for signatures."""
    return ", ".join(f"key {k!r} {spec(arrays[0])}" for k, arrays in pairs_)


@dataclass
class CheckedCall:
    """A pushpull call that passed its checks, remembered for the next step."""

    work: list                          # [(key, value arrays, out arrays or None)]
    signature: str                      # what the ranks agree on
    about: str = ""                     # the call's keys, for errors (" of key 3")
    plan: Optional[tuple] = None        # its fusion buckets (dense.DensePath.plan_buckets)
    engine_plan: Optional[tuple] = None  # its engine buckets (overlap.plan)
    meeting: Optional[object] = None    # its agreement in a bucket's meeting (overlap.Agreement)


Work = List[Tuple[Key, list, Optional[list]]]


def signed_work(op: str, key, value, out, slots: Dict[Key, KeySlot],
                check_route: Callable[[Key, KeySlot, str], None],
                asks_prefetch: Callable[[Key], bool]) -> Tuple[Work, str]:
    """Local checks of a push/pushpull: ``([(key, value, out)], signature)``. Raises
    KeyValueError on a bad argument."""
    ps = pairs(key, value, sparse_ok=op == "push")
    outs = pairs(key, out, "out") if out is not None else [(k, None) for k, _ in ps]
    signature = []
    for (k, v), (_, o) in zip(ps, outs):
        slot = lookup(slots, k)
        check_matches(k, slot, v, "value")
        stype = v[0].stype
        # host or accelerator decides fusion: part of what ranks must agree on
        where = "host" if on_host(v) and (o is None or on_host(o)) else "device"
        asks = " prefetch" if op == "push" and asks_prefetch(k) else ""
        signature.append(f"key {k!r} {slot.spec} {stype} {where}{asks}")
        check_route(k, slot, stype)
        if o is not None:
            check_out(k, v, o)
    return [(k, v, o) for (k, v), (_, o) in zip(ps, outs)], f"{op} {', '.join(signature)}"


class Calls:
    """Agreement and memo for one store (its group; ``patient``: whether the ranks wait
    for each other without spinning, see ``Placement.servers_in_step``)."""

    def __init__(self, group: Group, patient: Callable[[], bool]):
        self.group, self._patient = group, patient
        self._memo: Dict[tuple, CheckedCall] = {}
        self._checked: Dict[tuple, tuple] = {}   # see checked()
        #: runs before every meeting of the group here (``SparsePath.settle_pulls``)
        self.before_meeting: Callable[[], None] = lambda: None

    def check(self, what: str, build, about: str = "", settle: bool = True):
        """Run ``build()`` (local checks, returns (result, signature)) and agree with all
        ranks: every rank raises the same error if any rank failed or the signatures differ;
        returns this rank's result. ``settle=False``: a call that sends nothing after the
        agreement need not wait for ``before_meeting`` first."""
        if settle:
            self.before_meeting()
        try:
            result, signature = build()
            error = None
        except KeyValueError as exc:
            result, signature, error = None, None, str(exc)
        agree(self.group, what, signature, error, about, patient=self._patient())
        return result

    def pushpull(self, key, value, out, build: Callable[[], Tuple[Work, str]],
                 on_engine: bool) -> Tuple[CheckedCall, bool]:
        """A checked pushpull, once per repeated call (``build``: ``signed_work``), and whether
        the ranks agreed on it here. A training loop repeats the same call with the same
        arrays every step, and an NDArray's shape, dtype, storage and device never change.
        The memo holds the arrays, so their handles cannot be reused meanwhile; every call
        still runs the agreement: where the dense path runs ``on_engine``, a repeated
        call's is left to it (on its communication thread: ``DensePath.pushpull``)."""
        ident = (call_key(key), _handles(value), _handles(out))
        call = self._memo.get(ident)
        if call is not None:
            if on_engine:
                return call, False
            self.before_meeting()
            agree(self.group, "pushpull", call.signature, None, call.about,
                  patient=self._patient())
            return call, True

        def checked():
            work, signature = build()
            return CheckedCall(work, signature, f" of key {key!r}"), signature

        call = self.check("pushpull", checked, f" of key {key!r}")
        if len(self._memo) >= MEMO_LIMIT:  # a loop that makes new arrays every step
            self._memo.clear()
        self._memo[ident] = call
        return call, True

    def checked(self, op: str, key, arrays, build: Callable[[], tuple]) -> tuple:
        """``build()``'s local checks of a call (a push's ``signed_work``, a pull's checks
        of its outs), run once per repeated call on the same arrays, as ``pushpull``'s; the
        agreement is the caller's. Only checks that passed are remembered, and what else
        they read (a key's route, compression) changes only with ``forget``."""
        ident = (op, call_key(key), _handles(arrays))
        try:
            result = self._checked.get(ident)
        except TypeError:   # an unhashable key: build() raises the error that names it
            return build()
        if result is None:
            result = build()
            if len(self._checked) >= MEMO_LIMIT:
                self._checked.clear()
            self._checked[ident] = result
        return result

    def forget(self) -> None:
        """Drop the remembered calls (a key's route or the store's paths changed)."""
        self._memo.clear()
        self._checked.clear()

    def __len__(self) -> int:
        return len(self._memo)
