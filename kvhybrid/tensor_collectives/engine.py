"""Collectives scheduled by MXNet's engine, so communication overlaps compute.

``EngineComm.submit(name, arrays, work)`` pushes one asynchronous operation into
MXNet's dependency engine that *mutates* ``arrays``: the engine starts it once every
operation already pushed on those arrays (the backward pass writing a bucket of
gradients) has finished, and holds back every later one (the optimizer's update)
until it completes. ``submit`` returns at once; Python goes on while the engine
computes. This is Horovod's and BytePS's MXNet op design (``horovod/mxnet/mpi_ops.cc``):

- the operation has the CPU-prioritized property, so the engine runs it on its
  priority threads, never on a compute worker; all it does there is hand the
  operation to this module's communication thread and return: in C where the helper
  ``engine_start.cc`` was built (no GIL taken on MXNet's thread: a Python function there
  made the pushing caller's thread wait for the GIL), else a Python callback;
- the communication thread runs ``work`` (an MPI collective on host views of the
  arrays) in *submission order*, waiting for each operation to be started by the
  engine. Every rank submits the same operations in the same order (the store's
  bucket plan, agreed once), so MPI sees one fixed order per communicator, as PyTorch
  DDP's reducer guarantees; the engine may start them in any order;
- the completion is always called, also when ``work`` fails (the error is kept and
  raised on the caller's thread by ``check()``), else ``waitall`` would hang;
- the arrays are referenced until completion; no deleter is handed to MXNet (a
  Python deleter pending at interpreter exit aborts the process).

The thread runs collectives on a communicator of its own (``Group`` duplicates it),
next to the caller's thread using the group's: MPI must provide
``MPI_THREAD_MULTIPLE`` (``thread_level_ok``), else the store keeps the blocking path.
Every wait of the thread is timed by that group's watchdog.
"""
from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Optional, Sequence, Union

from mxnet.base import _LIB, check_call
from mxnet.ndarray import NDArray

from ..errors import KeyValueError, KVHybridError
from .native import Helper

log = logging.getLogger("kvhybrid")

#: ``mxnet::FnProperty::kCPUPrioritized`` (include/mxnet/engine.h)
CPU_PRIORITIZED = 3
#: ``mxnet::Context::kCPU``
_CPU = 1
#: operation timings kept when recording
TIMELINE = 10_000

_ASYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_COMPLETE_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _Context(ctypes.Structure):
    """``mxnet::Context``: where the operation runs (the host; the arrays may be anywhere
    the caller staged them from)."""
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


class _OnComplete(ctypes.Structure):
    """``mxnet::engine::CallbackOnComplete`` (include/mxnet/engine.h): the engine hands a
    pointer to one living on its stack, so the three fields are copied out."""
    _fields_ = [("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p)]


class _Slot(ctypes.Structure):
    """One operation's start, written by ``engine_start.cc`` on MXNet's thread: whether it
    started, the engine's completion copied out, when (``time.perf_counter`` seconds)."""
    _fields_ = [("started", ctypes.c_uint32), ("padding", ctypes.c_uint32),
                ("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p), ("ready_at", ctypes.c_double)]


#: microseconds of one sleep on a slot: the wait loops in Python between them
_SLOT_SLEEP_US = 200_000

#: MXNet's library, called with the GIL held: where the C helper starts the operations,
#: the push is a few microseconds of C that takes no lock of ours, and releasing the GIL
#: there let the communication thread, just woken, take it, so the pushing caller waited
#: for it on the way back
_LIB_HOLDING_GIL = ctypes.PyDLL(_LIB._name)

#: operation names kept encoded per communication thread (a store names a few per step)
_NAMES_KEPT = 1024


class EngineArrays:
    """The arrays one operation mutates and reads, with their handles laid out for MXNet
    once: a bucket's operation names the same arrays every step (``overlap.py``), and
    laying them out was a large part of a submit's cost on the caller's thread.
    The arrays must stay the same objects (an NDArray's handle never changes)."""

    __slots__ = ("arrays", "c_mutated", "c_reads")

    def __init__(self, mutated: Sequence[NDArray], reads: Sequence[NDArray] = ()):
        self.arrays = list(mutated) + list(reads)   # (held: the handles must stay valid)
        self.c_mutated = (ctypes.c_void_p * len(mutated))(*[a.handle.value for a in mutated])
        self.c_reads = (ctypes.c_void_p * len(reads))(*[a.handle.value for a in reads])


_HELPER = Helper("_engine_start", "KVHYBRID_CPP_HELPER",
                 "MXNet's engine starts the store's operations through Python",
                 {"kvhybrid_engine_wait_started": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
                  "kvhybrid_engine_complete": (None, [ctypes.c_void_p])})


def _native_start():
    """The helper's start (as a function pointer for MXNet), wait and complete, or None
    where it was not built or is off (``KVHYBRID_CPP_HELPER=0``)."""
    lib = _HELPER.library()
    if lib is None:
        return None
    return (ctypes.cast(lib.kvhybrid_engine_started, ctypes.c_void_p),
            lib.kvhybrid_engine_wait_started, lib.kvhybrid_engine_complete)


def thread_level_ok(MPI) -> bool:
    """Whether two threads may call MPI at once (the caller's and the communication thread)."""
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


class _Op:
    __slots__ = ("ident", "name", "arrays", "work", "started", "done", "ready_at", "cleanup",
                 "slot")

    def __init__(self, ident: int, name: str, arrays: Sequence[NDArray],
                 work: Callable[[], None], cleanup: Optional[Callable[[], None]] = None,
                 started: Optional[threading.Event] = None, slot: Optional[_Slot] = None):
        self.ident, self.name, self.arrays, self.work = ident, name, list(arrays), work
        self.cleanup = cleanup
        #: where the engine's start lands: a slot the C helper fills, else this event
        self.slot = slot
        self.started = started if started is not None or slot is not None \
            else threading.Event()
        self.done: Optional[_OnComplete] = None
        self.ready_at = 0.0


#: where ``when_ready``'s operations run, and how (module-wide: they are never changed)
_HOST = _Context(_CPU, 0)
_PRIORITIZED = ctypes.c_int(CPU_PRIORITIZED)


@dataclass(frozen=True)
class OpTiming:
    """When one operation's inputs were ready (the engine started it), and when its
    collective began and ended (``time.perf_counter`` seconds)."""
    name: str
    ready: float
    begin: float
    end: float


#: the start of every enqueued job (it waits for no engine operation): set once, shared
_STARTED = threading.Event()
_STARTED.set()

#: every live EngineComm by id: the engine's callback finds its op through it
_COMMS: Dict[int, "EngineComm"] = {}


@_ASYNC_FUNC
def _engine_started(rctx, on_complete, param) -> None:
    """Called by an engine priority thread when an op's inputs are ready."""
    comm_id, ident = divmod(int(param or 0), 1 << 40)
    comm = _COMMS.get(comm_id)
    op = comm._ops.get(ident) if comm is not None else None
    src = _OnComplete.from_address(on_complete)
    done = _OnComplete(src.callback, src.engine, src.param)
    if op is None:   # cannot happen while the comm lives; never leave the engine waiting
        _COMPLETE_FUNC(done.callback)(done.engine, done.param, None)
        return
    op.done = done
    op.ready_at = time.perf_counter()
    op.started.set()


def _complete(done: _OnComplete) -> None:
    _COMPLETE_FUNC(done.callback)(done.engine, done.param, None)


#: ``when_ready``'s callbacks by id, until the engine calls them
_READY: Dict[int, Callable[[], None]] = {}
_ready_ids = itertools.count(1)


@_ASYNC_FUNC
def _engine_ready(rctx, on_complete, param) -> None:
    """Called by an engine priority thread when a ``when_ready`` operation may run."""
    src = _OnComplete.from_address(on_complete)
    done = _OnComplete(src.callback, src.engine, src.param)
    callback = _READY.pop(int(param or 0), None)
    try:
        if callback is not None:
            callback()
    except BaseException:   # noqa: B902 (never into MXNet's engine thread)
        log.exception("kvhybrid: a callback of MXNet's engine failed")
    finally:
        _complete(done)


def when_ready(name: str, reads: Sequence[NDArray], callback: Callable[[], None]) -> None:
    """Call ``callback`` on an engine thread once every operation pushed so far that writes
    ``reads`` (distinct arrays) has finished: one engine operation that reads them and does
    nothing else. ``callback`` must be quick (it holds an engine priority thread)."""
    ident = next(_ready_ids)
    _READY[ident] = callback
    read = (ctypes.c_void_p * len(reads))(*[a.handle.value for a in reads])
    try:
        check_call(_LIB.MXEnginePushAsyncND(
            _engine_ready, ctypes.c_void_p(ident), None, ctypes.byref(_HOST), read, len(reads),
            None, 0, ctypes.byref(_PRIORITIZED), 0,
            ctypes.c_char_p(b"kvhybrid_" + name.encode()[:64]), False))
    except BaseException:
        _READY.pop(ident, None)
        raise


#: what a waiting ``Flag`` waits on (every flag's set wakes it)
_FLAG_SET = threading.Condition()


class Flag:
    """``threading.Event``'s ``set``, ``is_set`` and ``wait`` for a flag made every step,
    set once by a job and read by the caller's thread (a prefetch's rows, a pull's check):
    making an Event makes a Condition and its lock, many times this one's cost on the
    caller's thread, for a flag that is nearly always set before anyone looks. The rare
    waiter waits on one Condition shared by every flag."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _FLAG_SET:
            self._set = True
            _FLAG_SET.notify_all()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Whether the flag is set, waiting up to ``timeout`` seconds for it (callers loop,
        so waking for another flag's set only returns early)."""
        with _FLAG_SET:
            if not self._set:
                _FLAG_SET.wait(timeout)
            return self._set


class InPlace:
    """``EngineComm.submit``'s work run at once on the caller's thread, once MXNet's engine
    has written what it reads and let go of what it writes: the executor of a job where no
    communication thread runs, so that a path has one function whichever thread runs it.
    ``cleanup`` runs whatever happens; an error of ``work`` is raised here, after it."""

    @staticmethod
    def submit(name: str, arrays: Sequence[NDArray], work: Callable[[], None],
               priority: int = 0, reads: Sequence[NDArray] = (),
               cleanup: Optional[Callable[[], None]] = None) -> None:
        for a in reads:
            a.wait_to_read()
        for a in arrays:
            check_call(_LIB.MXNDArrayWaitToWrite(a.handle))
        try:
            work()
        finally:
            if cleanup is not None:
                cleanup()


IN_PLACE = InPlace()


class EngineComm:
    """Runs collectives of one group (``group``: its own communicator and watchdog) as
    MXNet engine operations, in submission order, on one communication thread."""

    _next_id = 1

    def __init__(self, group):
        self.group = group
        self.ident = EngineComm._next_id
        EngineComm._next_id += 1
        self._ops: Dict[int, _Op] = {}
        self._queue: Deque[_Op] = collections.deque()
        self._cv = threading.Condition()
        self._names: Dict[str, ctypes.c_char_p] = {}
        self._count = 0
        self._closing = False
        self.error: Optional[str] = None
        self._error_type: type = KVHybridError   # KeyValueError: calls that differ
        #: operations run, for tests and benchmarks
        self.ops_run = 0
        #: the last TIMELINE operations' timings, when ``record`` is on (benchmarks)
        self.record = False
        self.timeline: Deque[OpTiming] = collections.deque(maxlen=TIMELINE)
        self._ctx = _Context(_CPU, 0)
        self._prop = ctypes.c_int(CPU_PRIORITIZED)
        #: the C helper's (start, wait, complete), or None: the Python callback starts ops
        self._native = _native_start()
        _COMMS[self.ident] = self
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"kvhybrid-comm-{group.name}")
        self._thread.start()

    def submit(self, name: str, arrays: Union[Sequence[NDArray], EngineArrays],
               work: Callable[[], None], priority: int = 0, reads: Sequence[NDArray] = (),
               cleanup: Optional[Callable[[], None]] = None) -> None:
        """Queue ``work`` as an engine operation that mutates ``arrays`` and reads ``reads``
        (NDArrays with distinct memory: the engine would wait on an array listed twice
        forever; or both laid out once, ``EngineArrays``): it starts once every operation
        pushed before on them has written them, and later writes wait for it. ``cleanup``:
        as ``enqueue``'s."""
        self.check()
        if self._closing:
            raise KVHybridError(f"the communication thread of group {self.group.name} is "
                                "closed: create a new store")
        if not isinstance(arrays, EngineArrays):
            arrays = EngineArrays(arrays, reads)
        self._count += 1
        slot = _Slot() if self._native is not None else None
        op = _Op(self._count, name, arrays.arrays, work, cleanup, slot=slot)
        self._ops[op.ident] = op   # (before the push: the Python start looks it up)
        if slot is not None:   # (the op, kept in _ops until completed, keeps the slot)
            push, start = _LIB_HOLDING_GIL.MXEnginePushAsyncND, self._native[0]
            param = ctypes.c_void_p(ctypes.addressof(slot))
        else:   # (the engine's thread calls Python, which needs the GIL: release it)
            push, start = _LIB.MXEnginePushAsyncND, _engine_started
            param = ctypes.c_void_p((self.ident << 40) + op.ident)
        try:
            check_call(push(start, param, None, ctypes.byref(self._ctx), arrays.c_reads,
                            len(arrays.c_reads), arrays.c_mutated, len(arrays.c_mutated),
                            ctypes.byref(self._prop), priority, self._encoded(name), False))
        except BaseException:   # (not pushed: nothing will start it)
            del self._ops[op.ident]
            raise
        # (woken after the push, the communication thread cannot take the GIL inside it)
        with self._cv:
            self._queue.append(op)
            self._cv.notify()

    def _encoded(self, name: str) -> ctypes.c_char_p:
        """``name`` as the engine's operation name (its profiler's), kept."""
        got = self._names.get(name)
        if got is None:
            if len(self._names) >= _NAMES_KEPT:
                self._names.clear()
            got = self._names[name] = ctypes.c_char_p(b"kvhybrid_" + name.encode()[:64])
        return got

    def enqueue(self, name: str, work: Callable[[], None],
                cleanup: Optional[Callable[[], None]] = None) -> None:
        """Queue ``work`` on the communication thread, after everything submitted so far,
        with no engine operation (it touches no NDArray the engine tracks). ``cleanup``
        runs after it on that thread whatever happens, also when an earlier failure skips
        ``work``."""
        self.check()
        self._count += 1
        op = _Op(self._count, name, (), work, cleanup, started=_STARTED)
        op.ready_at = time.perf_counter()
        with self._cv:
            self._ops[op.ident] = op
            self._queue.append(op)
            self._cv.notify()

    def check(self) -> None:
        """Raise, on the caller's thread, an error a collective of this group hit."""
        if self.error is not None:
            raise self._error_type(self.error)

    @property
    def pending(self) -> int:
        return len(self._ops)

    def _loop(self) -> None:
        dog = self.group.watchdog
        while True:
            with self._cv:   # (idle: no wait the watchdog times)
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                op = self._queue.popleft()
            try:
                with dog.waiting(lambda: f"MXNet's engine to compute the inputs of {op.name}",
                                 collective=False):
                    self._wait_started(op)
                if self.error is None:   # after a failure the rest only completes
                    begin = time.perf_counter()
                    op.work()
                    self.ops_run += 1
                    if self.record and (op.done is not None or op.slot is not None):
                        self.timeline.append(OpTiming(op.name, op.ready_at, begin,
                                                      time.perf_counter()))
            except KeyValueError as exc:   # the ranks' calls differ: every rank raises it
                self.error, self._error_type = str(exc), KeyValueError
                log.error("kvhybrid: %s", self.error)
            except BaseException as exc:   # noqa: B902 (kept and raised on the caller's thread)
                self.error = (f"the engine-scheduled collective {op.name} on group "
                              f"{self.group.name} failed: {type(exc).__name__}: {exc}")
                log.error("kvhybrid: %s", self.error)
            finally:
                self._wait_started(op)
                if op.cleanup is not None:
                    op.cleanup()
                del self._ops[op.ident]
                op.arrays = []
                if op.slot is not None:
                    self._native[2](ctypes.addressof(op.slot))
                elif op.done is not None:   # an engine operation (not an enqueued job)
                    _complete(op.done)

    def _wait_started(self, op: _Op) -> None:
        """Until the engine has started ``op`` (its inputs written): on its slot's futex
        where the C helper starts it, else on its event."""
        if op.slot is None:
            op.started.wait()
            return
        address, wait = ctypes.addressof(op.slot), self._native[1]
        while not wait(address, _SLOT_SLEEP_US):
            pass
        op.ready_at = op.slot.ready_at

    def close(self) -> None:
        """Let queued work finish (the caller waited for the engine first: every engine
        operation has been started), then stop the thread. Its waits are the watchdog's."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout=2 * self.group.watchdog.timeout)
        if self._thread.is_alive():
            log.warning("kvhybrid: the communication thread of group %s did not finish its "
                        "%d queued operations", self.group.name, len(self._ops))
        else:
            _COMMS.pop(self.ident, None)
