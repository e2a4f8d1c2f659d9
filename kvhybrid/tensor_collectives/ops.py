"""Collectives on NDArrays: one signature everywhere, ``(tensor, ..., group)``.

A *tensor* is what one worker holds of a key: an NDArray, or the list of its
per-device copies (the MXNET-MPI paper's tensor). Its device arrays are
reduced locally first, then reduced across the group once, then copied back
to every device — one collective per key, whatever the number of devices.

Host arrays are handed to MPI in place through zero-copy views; arrays on an
accelerator go through a pinned host staging buffer.
"""
from __future__ import annotations

import ctypes
import logging
import math
import sys
import threading
import time
from typing import Callable, List, Sequence, Union

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from .group import Group
from .native import Helper
from .ndarray_view import host_view, is_host, wait_to_write

log = logging.getLogger("kvhybrid")

Tensor = Union[NDArray, Sequence[NDArray]]

REDUCE_OPS = ("sum", "max", "min")


def _as_list(tensor: Tensor) -> List[NDArray]:
    arrays = [tensor] if isinstance(tensor, NDArray) else list(tensor)
    if not arrays or not all(isinstance(a, NDArray) for a in arrays):
        raise TypeError("tensor must be an NDArray or a non-empty list of NDArrays")
    return arrays


def describe(arr: NDArray) -> str:
    mb = arr.size * np.dtype(arr.dtype).itemsize / 2**20
    return f"{tuple(arr.shape)} {np.dtype(arr.dtype).name} ({mb:.1f} MB)"


# -- MPI reduction operators per dtype ---------------------------------------------------
_FP16_OPS: dict = {}


def _mpi_op(MPI, op: str, dtype: np.dtype):
    """The MPI operator for ``op`` on ``dtype``; float16 needs a user-defined one."""
    if dtype != np.float16:
        return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    if op not in _FP16_OPS:
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]

        def reduce_fp16(inbuf, inoutbuf, datatype, fn=fn):
            a = np.frombuffer(inbuf, dtype=np.float16)
            b = np.frombuffer(inoutbuf, dtype=np.float16)
            fn(a, b, out=b)

        _FP16_OPS[op] = MPI.Op.Create(reduce_fp16, commute=True)
    return _FP16_OPS[op]


def _mpi_buffer(MPI, view: np.ndarray):
    if view.dtype == np.float16:
        return [view, MPI.UINT16_T]  # bytes moved as uint16, reduced by the fp16 operator
    return view


# -- local parts ---------------------------------------------------------------------------
def reduce_local(arrays: Sequence[NDArray], out: NDArray) -> None:
    """``out = sum(arrays)`` across a worker's devices (``out`` may be ``arrays[0]``)."""
    if out.size == 0:  # MXNet's copy and sum operators reject empty arrays
        return
    if len(arrays) == 1:
        if arrays[0] is not out:
            arrays[0].copyto(out)
        return
    inputs = [a if a.context == out.context else a.as_in_context(out.context) for a in arrays]
    mx.nd.add_n(*inputs, out=out)


def copy_to_all(src: NDArray, outs: Sequence[NDArray]) -> None:
    if src.size == 0:
        return
    for o in outs:
        if o is not src:
            src.copyto(o)


def _in_place(arr: NDArray, group: Group, what: Callable[[], str],
              fn: Callable[[np.ndarray], None]) -> None:
    """Run ``fn`` on a host view of ``arr`` (staging it when it is on an accelerator).

    ``what`` describes the operation for the watchdog; it is only called when
    a wait has to be reported, keeping string formatting off the hot path.
    """
    shape, dtype = arr.shape, np.dtype(arr.dtype)
    count = math.prod(shape)
    if count == 0:
        return
    dog = group.watchdog
    host = arr if is_host(arr) else group.staging(count, dtype)
    if host is not arr:
        arr.reshape((count,)).copyto(host)
    with dog.waiting(lambda: f"the MXNet engine to finish writing {what()}", collective=False):
        wait_to_write(host)
    with dog.waiting(what):
        fn(host_view(host, dtype, count))
    group.bytes_sent["dense"] += count * dtype.itemsize
    if host is not arr:
        host.reshape(shape).copyto(arr)


# -- collectives ---------------------------------------------------------------------------
def allreduce_array(arr: NDArray, op: str = "sum", group: Group = None, name: str = "") -> None:
    """Reduce one array across the group, in place."""
    MPI, dtype = group.MPI, np.dtype(arr.dtype)
    algorithm = group.algorithms.select(arr.size * dtype.itemsize, op)
    if op == "sum":
        reduce = group.algorithms.allreduce
    else:
        mpi_op = _mpi_op(MPI, op, dtype)
        reduce = lambda v: group.comm.Allreduce(MPI.IN_PLACE, _mpi_buffer(MPI, v), op=mpi_op)  # noqa: E731
    _in_place(arr, group,
              lambda: f"allreduce({op}, {algorithm}) of {name or 'a tensor'} {describe(arr)} on "
                      f"group {group.name} of {group.size} ranks",
              reduce)


#: the longest sleep between two tests of a patient wait. Open MPI moves a large message
#: over TCP only inside MPI calls (its rendezvous needs both sides to answer), so a long
#: sleep stalls a transfer (the CNN's ring allreduce across emulated hosts was slowest with
#: the longest sleeps; spinning matched short ones at twice the CPU: docs/performance.md)
LONGEST_SLEEP = 1e-4


#: seconds a patient wait tests without sleeping first: a rank whose partners are already
#: there is answered at once, where one sleep costs far more (``python -m benchmarks.waits``)
SPIN_SECONDS = 50e-6

#: a patient wait's first sleep, in seconds: the sleeps grow by half to ``LONGEST_SLEEP``
FIRST_SLEEP = 50e-6

#: tests each time a patient wait wakes: a message that arrived while it slept may need a
#: second progress call to finish
TESTS_PER_WAKE = 3

#: the timer slack of a thread that waits patiently, in ns. Linux lets a sleep overrun by
#: the thread's slack, by default as long as the short sleeps themselves
TIMER_SLACK_NS = 1000

#: ``prctl``'s option that sets the calling thread's timer slack (linux/prctl.h)
PR_SET_TIMERSLACK = 29


def wait_patiently(request) -> None:
    """Wait for a non-blocking MPI request: test for ``SPIN_SECONDS``, then sleep between
    tests (``FIRST_SLEEP`` growing to ``LONGEST_SLEEP``), in the C++ helper where it was
    built (the GIL let go), else in Python.

    For waits on another rank's network round trip (a group master talking to the
    servers): MPI's blocking calls spin, and on a host with more processes than cores the
    spinning ranks take the CPU from the master and the servers they wait for. Every rank must use the non-blocking call,
    the one that waits for others included: MPI matches blocking and non-blocking
    collectives with each other only in MPI 4."""
    _wait_requests([request])


def allreduce_patiently(view: np.ndarray, op: str, group: Group, what) -> None:
    """A small allreduce of ``view`` in place (flags, a verdict, a measure), waited for
    without spinning (``wait_patiently``) under ``group``'s watchdog, ``what`` naming it:
    the store's checks that every rank made the same call."""
    MPI = group.MPI
    with group.watchdog.waiting(what):
        group.meet()
        wait_patiently(group.comm.Iallreduce(MPI.IN_PLACE, view,
                                             op=_mpi_op(MPI, op, view.dtype)))


def wait_all_patiently(requests: Sequence) -> None:
    """``wait_patiently`` for several requests at once."""
    _wait_requests(requests)


def _wait_requests(requests: Sequence) -> None:
    """The patient waits' one loop: the helper's where it can wait for ``requests``."""
    _precise_sleeps()
    MPI = _helped(requests)
    if MPI is None:
        _sleep_until(lambda: all(r.Test() for r in requests))
        return
    wait = _WAIT.library().kvhybrid_wait_requests
    handles = (ctypes.c_void_p * len(requests))(*[MPI._addressof(r) for r in requests])
    error = ctypes.c_int(0)
    spin, first = int(SPIN_SECONDS * 1e9), int(FIRST_SLEEP * 1e9)
    while True:
        got = wait(_MPI_TEST[0], handles, len(requests), spin, first,
                   int(LONGEST_SLEEP * 1e9), TESTS_PER_WAKE, int(_WAIT_BUDGET * 1e9),
                   ctypes.byref(error))
        if got == 0:
            break
        if got == 2:
            raise MPI.Exception(error.value)
        spin, first = 0, int(LONGEST_SLEEP * 1e9)   # (called again: sleep the longest at once)
    for r in requests:   # (null already: mpi4py's own Test lets go of the request's buffer)
        r.Test()


_WAIT = Helper("_patient_wait", "KVHYBRID_CPP_HELPER", "patient waits test and sleep in Python",
               {"kvhybrid_wait_requests": (ctypes.c_int, [
                   ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                   ctypes.c_int64, ctypes.POINTER(ctypes.c_int)])})

#: seconds the helper waits before it returns to Python, which may take a signal there
_WAIT_BUDGET = 0.05

#: the address of MPI_Test in the library mpi4py calls, once looked for (0: not found)
_MPI_TEST: List[int] = []


def _helped(requests: Sequence):
    """mpi4py's MPI module where the helper can wait for ``requests`` (mpi4py's requests,
    the helper built, MPI_Test found), else None. MPI_Test is looked up through mpi4py's
    own shared object, whose dependencies are searched (its MPI library is not loaded
    globally); so a profiler's MPI_Test put before it (``LD_PRELOAD``) does not see these
    calls."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or _WAIT.library() is None \
            or not all(isinstance(r, MPI.Request) for r in requests):
        return None
    if not _MPI_TEST:
        try:
            test = ctypes.cast(ctypes.CDLL(MPI.__file__).MPI_Test, ctypes.c_void_p).value
        except (OSError, AttributeError) as exc:
            test = None
            log.debug("MPI_Test not found through %s (%s): patient waits test and sleep in "
                      "Python", MPI.__file__, exc)
        _MPI_TEST.append(test if test and hasattr(MPI, "_addressof") else 0)
    return MPI if _MPI_TEST[0] else None


def _sleep_until(done: Callable[[], bool]) -> None:
    end = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < end:
        if done():
            return
    delay = FIRST_SLEEP
    while True:
        for _ in range(TESTS_PER_WAKE):
            if done():
                return
        time.sleep(delay)
        delay = min(delay * 1.5, LONGEST_SLEEP)


_slack = threading.local()


def _precise_sleeps() -> None:
    """Set this thread's timer slack to ``TIMER_SLACK_NS`` once (Linux; elsewhere sleeps
    stay as they are). It changes how late this thread's sleeps may end, nothing else."""
    if getattr(_slack, "set", False):
        return
    _slack.set = True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(TIMER_SLACK_NS), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _bcast(group: Group, view: np.ndarray, src: int, patient: bool) -> None:
    buf = _mpi_buffer(group.MPI, view)
    if not patient:
        group.comm.Bcast(buf, root=src)
    elif group.rank == src:
        request = group.comm.Ibcast(buf, root=src)
        group.from_root(src)
        request.Wait()
    else:
        group.from_root(src)
        wait_patiently(group.comm.Ibcast(buf, root=src))


def broadcast_array(arr: NDArray, src: int = 0, group: Group = None, name: str = "",
                    patient: bool = False) -> None:
    """Overwrite ``arr`` on every rank with rank ``src``'s copy, in place. ``patient``:
    the others wait for ``src`` without spinning (``wait_patiently``); every rank must
    pass the same."""
    _in_place(arr, group,
              lambda: f"broadcast from rank {src} of {name or 'a tensor'} {describe(arr)} on "
                      f"group {group.name} of {group.size} ranks",
              lambda v: _bcast(group, v, src, patient))


def broadcast_view(view: np.ndarray, src: int = 0, group: Group = None, name: str = "",
                   patient: bool = False) -> None:
    """``broadcast_array`` of a host view the caller made (the engine must not be using
    its memory)."""
    if view.size == 0 or group.size == 1:
        return
    with group.watchdog.waiting(lambda: f"broadcast from rank {src} of {name or 'a tensor'} "
                                        f"({view.nbytes:,} bytes) on group {group.name} of "
                                        f"{group.size} ranks"):
        _bcast(group, view, src, patient)
    group.bytes_sent["dense"] += view.nbytes


def allreduce(tensor: Tensor, op: str = "sum", group: Group = None) -> None:
    """Reduce ``tensor`` over its devices and over the group; every device array gets the result."""
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    if group is None:
        raise ValueError("group is required: pass a kvhybrid Group (e.g. store.group)")
    arrays = _as_list(tensor)
    if op == "sum":
        reduce_local(arrays, arrays[0])
    elif arrays[0].size:
        fn = mx.nd.maximum if op == "max" else mx.nd.minimum
        for a in arrays[1:]:
            arrays[0][:] = fn(arrays[0], a.as_in_context(arrays[0].context))
    allreduce_array(arrays[0], op, group)
    copy_to_all(arrays[0], arrays)


def broadcast(tensor: Tensor, src: int = 0, group: Group = None) -> None:
    """Give every device array of every rank the value of ``tensor[0]`` on rank ``src``."""
    if group is None:
        raise ValueError("group is required: pass a kvhybrid Group (e.g. store.group)")
    if not 0 <= src < group.size:
        raise ValueError(f"src must be a rank in [0, {group.size}), got {src}")
    arrays = _as_list(tensor)
    broadcast_array(arrays[0], src, group)
    copy_to_all(arrays[0], arrays)
