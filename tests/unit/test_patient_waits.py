"""How the store waits for a non-blocking MPI call (``ops.wait_patiently``), without MPI: a
request that completes while the wait spins costs no sleep; one that takes longer is
tested several times per wake-up with the thread's sleeps made precise."""
import ctypes
import sys
import threading

import pytest

from kvhybrid.tensor_collectives import ops


class Request:
    """Completes at its ``after``-th test."""

    def __init__(self, after: int):
        self.after, self.tests = after, 0

    def Test(self) -> bool:
        self.tests += 1
        return self.tests >= self.after


def counting_sleeps(monkeypatch):
    sleeps = []
    monkeypatch.setattr(ops.time, "sleep", lambda s: sleeps.append(s))
    return sleeps


def test_a_request_done_while_spinning_never_sleeps(monkeypatch):
    sleeps = counting_sleeps(monkeypatch)
    monkeypatch.setattr(ops, "SPIN_SECONDS", 60.0)   # a busy machine may preempt the spin
    request = Request(after=3)
    ops.wait_patiently(request)
    assert request.tests == 3 and sleeps == []


def test_after_the_spin_each_wake_up_tests_several_times(monkeypatch):
    sleeps = counting_sleeps(monkeypatch)
    monkeypatch.setattr(ops, "SPIN_SECONDS", 0.0)   # straight to the sleeps
    request = Request(after=2 * ops.TESTS_PER_WAKE + 1)
    ops.wait_patiently(request)
    assert len(sleeps) == 2, sleeps
    assert sleeps[0] == pytest.approx(50e-6) and max(sleeps) <= ops.LONGEST_SLEEP


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_a_thread_that_sleeps_gets_a_precise_timer(monkeypatch):
    monkeypatch.setattr(ops, "SPIN_SECONDS", 0.0)   # straight to the sleeps
    got = []

    def waiter():
        ops.wait_patiently(Request(after=10))
        got.append(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))   # PR_GET_TIMERSLACK

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(10)
    assert got == [ops.TIMER_SLACK_NS]


# -- the C++ helper's loop (patient_wait.cc), given an MPI_Test made here -----------------
helper = ops._WAIT.library()
needs_helper = pytest.mark.skipif(
    helper is None,
    reason="the patient wait's helper was not built (pip install --no-build-isolation -e .)")
_MPI_TEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                             ctypes.c_void_p)


def _helper_wait(answer, count=1, spin_ns=0, budget_ns=10**9):
    """The helper's wait for ``count`` requests (handles 1, 2, ...) with an MPI_Test that
    returns ``answer(handle, its tests so far)``: (error code, complete). Returns what it
    returned, the error it gave and the handles tested, in order."""
    tested = []

    @_MPI_TEST
    def test(request, flag, status):
        tested.append(request)
        code, done = answer(request, tested.count(request))
        flag[0] = int(done)
        return code

    handles = (ctypes.c_void_p * count)(*range(1, count + 1))
    error = ctypes.c_int(-7)
    got = helper.kvhybrid_wait_requests(ctypes.cast(test, ctypes.c_void_p), handles, count,
                                        spin_ns, 1000, 2000, 3, budget_ns, ctypes.byref(error))
    return got, error.value, tested


@needs_helper
def test_the_helper_tests_several_times_a_wake_until_the_request_completes():
    got, error, tested = _helper_wait(lambda handle, n: (0, n == 7))
    assert (got, error, tested) == (0, 0, [1] * 7)   # 3, sleep, 3, sleep, the 7th


@needs_helper
def test_the_helper_tests_the_next_request_once_the_one_before_completes():
    got, _, tested = _helper_wait(lambda handle, n: (0, n == 2), count=2)
    assert got == 0 and tested == [1, 1, 2, 2]


@needs_helper
def test_the_helper_returns_to_python_when_its_budget_passes():
    got, error, tested = _helper_wait(lambda handle, n: (0, False), budget_ns=2_000_000)
    assert got == 1 and error == 0 and len(tested) >= 3


@needs_helper
def test_the_helper_hands_back_the_error_of_a_failed_test():
    got, error, tested = _helper_wait(lambda handle, n: (5 if n == 2 else 0, False))
    assert (got, error, tested) == (2, 5, [1, 1])


@needs_helper
def test_a_call_past_its_budget_still_tests_once_per_wake():
    got, _, tested = _helper_wait(lambda handle, n: (0, n == 3), budget_ns=0)
    assert got == 0 and tested == [1] * 3
    got, _, tested = _helper_wait(lambda handle, n: (0, False), budget_ns=0)
    assert got == 1 and tested == [1] * 3   # one wake's tests, then back to Python
