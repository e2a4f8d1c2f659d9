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
