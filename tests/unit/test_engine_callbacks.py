"""``engine.when_ready``: a callback from MXNet's engine once the writes it waits for are done."""
import threading

import numpy as np
import mxnet as mx

from kvhybrid.tensor_collectives.engine import when_ready
from kvhybrid.tensor_collectives.ndarray_view import host_view


def test_the_callback_runs_after_the_writes_pushed_before_it():
    a = mx.nd.ones((1 << 20,))
    b = mx.nd.zeros((1 << 20,))
    for _ in range(20):   # a queue of writes the engine has not run yet
        mx.nd.elemwise_add(a, b, out=b)
    seen, called = [], threading.Event()

    def callback():   # (on an engine thread: the array is written, read it in place)
        seen.append(float(host_view(b, np.float32, b.size)[-1]))
        called.set()

    when_ready("a test", [b], callback)
    assert called.wait(30), "the engine never called back"
    assert seen == [20.0]


def test_a_failing_callback_leaves_the_engine_running():
    a = mx.nd.zeros((4,))
    when_ready("a failing test", [a], lambda: 1 / 0)   # logged, never raised into MXNet
    mx.nd.waitall()
    assert (a + 1).asnumpy().tolist() == [1.0] * 4
