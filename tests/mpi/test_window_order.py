"""Shared-memory windows that ranks made in different orders (threads make them lazily)
are freed in one order at exit: left to MPI_Finalize, which frees them in each process's
own order, their barriers can wait on different windows and the job never ends (seen on
emulated hosts: an LM whose table was densified finished and hung in MPI_Finalize)."""
import json

import pytest

from kvhybrid.tensor_collectives import windows
from tests.support.jobs import run_job


def test_windows_made_from_two_threads_in_opposite_orders_are_freed_and_the_job_ends(tmp_path):
    r = run_job(2, "window_order.py", [tmp_path], timeout=90)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert got[0]["made"] == got[1]["made"][::-1]   # the two ranks' orders were opposite
    for g in got:   # both allreduce windows among those open, and every open one freed
        assert all(any(k.startswith(f"{made}/0/") for k in g["registered"])
                   for made in g["made"]), g
        assert g["freed"] == len(g["registered"])


class FakeWindow:
    def __init__(self, key, freed):
        self.key, self.freed = key, freed

    def Free(self):
        self.freed.append(self.key)


class FakeComm:
    def __init__(self, arrives=True):
        self.arrives = arrives

    def Ibarrier(self):
        arrives = self.arrives

        class Request:
            def Test(self):
                return arrives
        return Request()


def test_windows_are_freed_in_key_order_whatever_order_they_were_made_in(monkeypatch):
    monkeypatch.setattr(windows, "_open", {})
    freed = []
    for key in ("000003-b/0", "000001-a/0", "000002-world-engine/0"):
        windows.register(key, FakeWindow(key, freed), FakeComm())
    assert windows.free_all() == 3
    assert freed == ["000001-a/0", "000002-world-engine/0", "000003-b/0"]
    assert windows.free_all() == 0   # nothing left for MPI_Finalize


def test_peers_that_never_come_leave_the_rest_to_mpi_after_the_timeout(monkeypatch, caplog):
    monkeypatch.setattr(windows, "_open", {})
    freed = []
    windows.register("1/0", FakeWindow("1/0", freed), FakeComm())
    windows.register("2/0", FakeWindow("2/0", freed), FakeComm(arrives=False))
    windows.register("3/0", FakeWindow("3/0", freed), FakeComm())
    assert windows.free_all(timeout=0.05) == 1
    assert freed == ["1/0"]
    assert "not every rank sharing the window of 2/0 came within" in caplog.text


def test_one_key_is_one_window(monkeypatch):
    monkeypatch.setattr(windows, "_open", {})
    windows.register("k", FakeWindow("k", []), FakeComm())
    with pytest.raises(ValueError, match="already open"):
        windows.register("k", FakeWindow("k", []), FakeComm())
