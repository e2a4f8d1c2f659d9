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


def test_a_label_within_another_counts_only_inside_it_and_outside_the_third(monkeypatch):
    import sys
    from benchmarks import caller_cpu
    fake = types.ModuleType("fake_within")
    fake.op = lambda: None
    fake.outer = lambda: fake.op()
    fake.pull = lambda: fake.op()
    fake.outer_with_pull = lambda: (fake.op(), fake.pull())
    monkeypatch.setitem(sys.modules, "fake_within", fake)
    monkeypatch.setitem(caller_cpu.WITHIN, "op", ("outer", "pull"))
    tally = Tally()
    for path in ("outer", "pull", "op"):
        tally.wrap("fake_within", path, path)
    fake.op()             # outside "outer": not counted
    fake.outer()          # counted
    fake.pull()           # not inside "outer"
    tally.wrap("fake_within", "outer_with_pull", "outer")   # (a second way in)
    fake.outer_with_pull()   # its own op counted, the pull's not
    assert tally.calls["op"] == 2


def test_the_operator_row_counts_a_gluon_forward_pass_operators():
    import mxnet as mx
    from mxnet import gluon
    from benchmarks.caller_cpu import FORWARD, OPERATORS, resolve
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, activation="relu"), gluon.nn.Dense(2))
    net.initialize()
    x = mx.nd.ones((3, 5))
    net(x)   # (the first call infers shapes: outside the tally)
    wrapped = [t for t in TIMED if t[2] in (OPERATORS, FORWARD)]
    saved = [resolve(module, path) for module, path, _ in wrapped]
    try:
        tally = Tally()
        for module, path, label in wrapped:
            tally.wrap(module, path, label)
        net(x)
        mx.nd.ones((2,)) + 1   # outside the forward pass: not counted
        assert tally.calls[FORWARD] == 1
        # FullyConnected, Activation, FullyConnected: every operator the net called
        assert tally.calls[OPERATORS] == 3, dict(tally.calls)
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
