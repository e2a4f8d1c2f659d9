"""benchmarks/comm_cpu.py's wrappers (no jobs run): every call it times still exists (a
renamed function would drop its row without a word), a job is labelled by its kind, and
only the communication threads' calls count."""
import sys
import threading
import types

import pytest

from benchmarks.comm_cpu import QUEUES, TIMED, job_kind, on_communication_thread
from benchmarks.cpu import COMMUNICATION_THREAD
from benchmarks.caller_cpu import Tally
from benchmarks.common import resolve


@pytest.mark.parametrize("module,path,label", TIMED + [
    ("kvhybrid.tensor_collectives.engine", path, "queue") for path, _ in QUEUES])
def test_every_timed_call_exists(module, path, label):
    import kvhybrid  # noqa: F401
    assert callable(resolve(module, path)[2]), (module, path)


def test_the_queues_take_the_work_where_the_wrapper_looks_for_it():
    import inspect
    from kvhybrid.tensor_collectives.engine import EngineComm
    for path, position in QUEUES:
        names = list(inspect.signature(getattr(EngineComm, path.split(".")[1])).parameters)
        assert names[position + 1] == "work", (path, names)   # (after self and the name)


@pytest.mark.parametrize("name,kind", [
    ("bucket 0 (keys 5..0)", "bucket"),
    ("bucket 12", "bucket"),
    ("the check of the prefetched rows of key 6", "the check"),
    ("the prefetched rows of key(s) 6, 7", "the prefetched rows"),
    ("the agreement on pushpull of key [5, 4]", "the agreement on pushpull"),
])
def test_a_job_is_labelled_by_its_kind(name, kind):
    assert job_kind(name) == kind


def test_only_the_communication_threads_calls_count():
    fake = types.ModuleType("fake_comm")
    fake.work = lambda: None
    sys.modules["fake_comm"] = fake
    try:
        tally = Tally(counts=on_communication_thread)
        tally.wrap("fake_comm", "work", "work")
        fake.work()   # the main thread: not counted
        for name in (f"{COMMUNICATION_THREAD}-world", "another"):
            thread = threading.Thread(target=fake.work, name=name)
            thread.start()
            thread.join()
        assert tally.calls["work"] == 1
    finally:
        del sys.modules["fake_comm"]
