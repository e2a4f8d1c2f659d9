"""benchmarks/caller_cpu.py's wrappers (no jobs run): every call it times still exists
(a renamed store method would drop its row without a word), and a label counts the
outermost call on the main thread only."""
import importlib
import threading
import types

import pytest

from benchmarks.caller_cpu import TIMED, Tally


@pytest.mark.parametrize("module,path,label", TIMED)
def test_every_timed_call_exists(module, path, label):
    import kvhybrid  # noqa: F401
    owner = importlib.import_module(module)
    for part in path.split("."):
        owner = getattr(owner, part)
    assert callable(owner), (module, path)


def test_a_label_counts_the_outermost_call_on_the_main_thread_only():
    fake = types.ModuleType("fake_timed")

    def nested(depth):
        return fake.nested(depth - 1) + 1 if depth else 0   # through the wrapper

    fake.nested = nested
    import sys
    sys.modules["fake_timed"] = fake
    try:
        tally = Tally()
        tally.wrap("fake_timed", "nested", "nested")
        assert fake.nested(5) == 5
        worker = threading.Thread(target=fake.nested, args=(3,))
        worker.start()
        worker.join()
        assert tally.calls["nested"] == 1
        assert tally.cpu_ns["nested"] >= 0
    finally:
        del sys.modules["fake_timed"]


def test_the_counts_start_over_when_the_warm_up_ends():
    fake = types.ModuleType("fake_steps")
    fake.step = lambda: None
    fake.other = lambda: None
    import sys
    from benchmarks.caller_cpu import STEP
    sys.modules["fake_steps"] = fake
    try:
        tally = Tally(warmup=2)
        tally.wrap("fake_steps", "step", STEP)
        tally.wrap("fake_steps", "other", "other")
        for _ in range(5):
            fake.other()
            fake.step()
        assert tally.calls[STEP] == 3 and tally.calls["other"] == 3
    finally:
        del sys.modules["fake_steps"]
