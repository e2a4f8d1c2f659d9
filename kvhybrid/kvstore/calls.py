"""Calls: each store call's local checks, the memo of repeated calls, and the agreement of
every rank on a call, in one place.

If one rank's call is wrong (unknown key, another shape) and only that rank raised, its
peers would enter the collective alone and wait forever. So every call that leads to a
collective is agreed first (``agree``): one small allreduce, or a digest brought to the
host barrier's meeting, tells every rank whether all ranks made the same call and none
failed its local checks; if not, every rank raises the same :class:`KeyValueError` before
anything changed. A training loop repeats the same call with the same arrays every step:
its local checks run once (the memo) and only the agreement runs again, on the
communication thread where the call's work runs there (``agree_later``,
``check_pulled_rows``).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mxnet.ndarray import NDArray

from ..errors import KeyValueError, explain
from ..tensor_collectives.engine import EngineComm
from ..tensor_collectives.fusion import on_host
from ..tensor_collectives.group import Group
from ..tensor_collectives.ops import allreduce_patiently
from .keys import Key, KeySlot, check_matches, check_out, lookup, pairs, spec

#: checked pushpull calls remembered per store
MEMO_LIMIT = 4096


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
                asks_prefetch: Callable[[Key], bool]) -> Tuple[Work, str]:
    """Local checks of a push/pushpull's arguments: ``([(key, value, out)], signature)``.
    Raises KeyValueError on a bad argument. ``asks_prefetch``: whether a push of a key
    carries the next step's row ids, which the ranks must agree on too."""
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
        #: runs before every meeting of the group here (``RowPulls.settle``)
        self.before_meeting: Callable[[], None] = lambda: None

    def check(self, what: str, build, about: str = ""):
        """Run ``build()`` (local checks, returns (result, signature)) and agree with all
        ranks: every rank raises the same error if any rank failed or the signatures differ;
        returns this rank's result."""
        self.before_meeting()
        try:
            result, signature = build()
            error = None
        except KeyValueError as exc:
            result, signature, error = None, None, str(exc)
        agree(self.group, what, signature, error, about, patient=self._patient())
        return result

    def check_known(self, what: str, call: Tuple[Optional[str], Optional[str]],
                    about: str = "") -> None:
        """``check`` of a call whose local checks were made before or failed (``call``:
        (local error, signature), from the memo): the same agreement, without building the
        call again."""
        error, signature = call
        self.before_meeting()
        agree(self.group, what, signature, error, about, patient=self._patient())

    def check_again(self, what: str, key, arrays, build, about: str,
                    comm: Optional[EngineComm]):
        """``check``, except that a call the ranks agreed on before with these very arrays
        (its checks passed then, and nothing they read has changed) is agreed on ``comm``'s
        thread (``agree_later``) where there is one: the caller's thread meets no one."""
        ident = ("agreed", what, call_key(key), _handles(arrays))
        try:
            known = self._checked.get(ident) if comm is not None else None
        except TypeError:   # an unhashable key: check() raises the error that names it
            known = ident = None
        if known is not None:
            agree_later(comm, what, known[1], about)
            return known[0]
        built = []

        def kept():   # (the signature too, for the memo)
            built.append(build())
            return built[0]

        result = self.check(what, kept, about)
        if ident is not None:   # (reached only if every rank's call passed)
            _remember(self._checked, ident, (*built[0], arrays))   # (held: handles stay theirs)
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
        _remember(self._memo, ident, call)
        return call, True

    def recall(self, op: str, key, arrays) -> Optional[tuple]:
        """The local checks of this very call (the same key and arrays) that ``remember``
        kept, or None: a training loop's repeated push or pull replays them, and only its
        agreement runs again (the caller's)."""
        try:
            return self._checked.get((op, call_key(key), _handles(arrays)))
        except TypeError:   # (an unhashable key is never kept: the checks name it)
            return None

    def remember(self, op: str, key, arrays, checked: tuple) -> tuple:
        """Keep a call's local checks that passed (``checked``, what its caller built: a
        push's ``SparsePush``, a pull's checked outs) for ``recall``; returns them. What else
        they read (a key's route, compression) changes only with ``forget``."""
        try:
            _remember(self._checked, (op, call_key(key), _handles(arrays)), checked)
        except TypeError:
            pass
        return checked

    def forget(self) -> None:
        """Drop the remembered calls (a key's route or the store's paths changed)."""
        self._memo.clear()
        self._checked.clear()

    def __len__(self) -> int:
        return len(self._memo)


def _remember(memo: dict, ident, entry) -> None:
    """Keep ``entry`` under ``ident``, the memo emptied first where it is full (a loop that
    makes new arrays every step)."""
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[ident] = entry


# -- the ranks' agreement ------------------------------------------------------------------
_MASK = (1 << 62) - 1
#: What a rank brings to the host barrier's meeting (``Group.meet``, ``meet_agreeing``,
#: ``meet_bringing``), by kind: 0 for a plain meeting; a call's digest with ``_MEETING`` set
#: for its agreement (``agree_in_meeting``); a negative number for a check of prefetched
#: rows (``sparse_pull.PullCheck``): ``PULL_CHECK``, ``UNCOVERED`` where this rank needs
#: the plain pull, ``PULL_ERROR`` where its call failed its checks, and the call's tag
#: (``TAG`` bits); a sum made in a meeting of its own
#: brings ``tensor_collectives.meeting_sum.SUM_MEETING`` (bit 61) with its dtype and size. A
#: rank that finds another kind beside its own is in another collective: the ranks' calls
#: differ.
_MEETING = 1 << 62
PULL_CHECK, UNCOVERED, PULL_ERROR, TAG = -(1 << 63), 1 << 62, 1 << 61, (1 << 61) - 1


def optimizer_signature(optimizer) -> str:
    """What must be equal on every rank, since every rank applies its own copy."""
    fields = {"learning_rate": optimizer.learning_rate, "wd": optimizer.wd,
              "rescale_grad": optimizer.rescale_grad, "clip_gradient": optimizer.clip_gradient}
    for name in ("momentum", "beta1", "beta2", "epsilon", "gamma1", "gamma2"):
        if hasattr(optimizer, name):
            fields[name] = getattr(optimizer, name)
    return f"{type(optimizer).__module__}.{type(optimizer).__name__}(" + \
        ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def digest(signature) -> int:
    """A 62-bit hash of a call's signature: what ranks compare. A training loop repeats
    its calls, so the hashes of hashable signatures are remembered."""
    try:
        return _remembered_digest(signature)
    except TypeError:   # (unhashable)
        return _digest(signature)


def _digest(signature) -> int:
    return int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=8).digest(),
                          "little") & _MASK


_remembered_digest = functools.lru_cache(maxsize=4096, typed=True)(_digest)


def agree(group: Group, what: str, signature, local_error: Optional[str], about: str = "",
          patient: bool = False) -> None:
    """Raise the same KeyValueError on every rank unless all signatures match and no rank failed.

    ``what`` names the call in the error (the same on every rank); ``about``
    adds this rank's detail (e.g. the key) to what the watchdog reports. ``patient``: wait
    without spinning (``wait_patiently``), for jobs whose ranks wait on each other's
    round trips to the parameter servers.
    """
    if group.size == 1:   # nobody to differ from: the verdict is this rank's own
        if local_error is not None:
            raise KeyValueError(explain(what, [(local_error, None)]))
        return
    MPI = group.MPI
    sig = digest(signature) if local_error is None else 0
    flags = np.array([sig, -sig, 1 if local_error else 0], dtype=np.int64)
    if patient:
        allreduce_patiently(flags, "max", group, lambda: f"the ranks to agree on {what}{about}")
    else:
        with group.watchdog.waiting(lambda: f"the ranks to agree on {what}{about}"):
            group.comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
    if flags[0] == -flags[1] and flags[2] == 0:
        return
    group.raise_calls_differ(what, local_error, None if local_error else str(signature), about)


def agree_in_meeting(group: Group, what: str, signature, about: str = "") -> bool:
    """``agree`` on a call every rank checked already (a repeated one), in the host barrier
    of the collective that follows (``Group.meet_agreeing``: each rank brings the call's
    digest) instead of a collective of its own: True, having met (the collective need not
    meet again), or the same KeyValueError on every rank; False at once where the group has
    no host barrier (``agree`` it then). Inside the watchdog's wait for that collective."""
    same = group.meet_agreeing(_MEETING | digest(signature))
    if same is None:
        return False
    if not same:
        group.raise_calls_differ(what, None, str(signature), about)
    return True


def agree_later(comm: EngineComm, what: str, signature, about: str = "") -> None:
    """``agree`` on a repeated call on the communication thread, before the call's work
    there, instead of on the caller's thread. If the ranks' calls differ, the thread stops
    running collectives (so none is mismatched) and the next call of the store raises, on
    every rank."""
    comm.enqueue(f"the agreement on {what}{about}",
                 lambda: agree(comm.group, what, signature, None, about, patient=True))


def pull_tag(key, signature) -> int:
    """What a pull of prefetched rows brings to its check (``check_pulled_rows``): ranks that
    bring the same tag made the same call (its signature names the key, the outs' shape and
    dtype)."""
    return digest(("row_sparse_pull", key, signature)) & TAG


def check_pulled_rows(group: Group, key, tag: int, covered: bool, error: Optional[str],
                      signature: Optional[str]) -> Tuple[bool, bool]:
    """The check of a pull of prefetched rows, on the communication thread: (whether some
    rank needs the plain pull, whether every rank made the same call and none failed), the
    same on every rank. ``covered``: this rank found its rows among the prefetched ones;
    ``error``: its call's local error. A rank needs the plain pull where its rows were not
    there or the calls differ. Where the ranks share a host each brings its verdict to the
    host barrier's meeting (``Group.meet_bringing``) and no collective follows; elsewhere a
    small allreduce decides."""
    what = lambda: f"the ranks to check their prefetched rows of key {key!r}"  # noqa: E731
    failed = error is not None
    with group.watchdog.waiting(what):
        brought = group.meet_bringing(PULL_CHECK | (0 if covered else UNCOVERED)
                                      | (PULL_ERROR if failed else 0) | tag)
    if brought is None:
        flags = np.array([0 if covered else 1, tag, -tag, int(failed)], dtype=np.int64)
        allreduce_patiently(flags, "max", group, what)
        agreed = bool(flags[1] == -flags[2] and not flags[3])
        return bool(flags[0] or not agreed), agreed
    if (brought >= 0).any():   # a rank met for another collective: the calls differ
        group.raise_calls_differ("row_sparse_pull", error, signature, f" of key {key!r}")
    tags = brought & TAG
    agreed = bool((tags == tags[0]).all() and not (brought & PULL_ERROR).any())
    return bool((brought & UNCOVERED).any() or not agreed), agreed
