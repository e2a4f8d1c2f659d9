"""How MXNet's engine starts the store's operations (engine.py): through the C helper
``engine_start.cc`` (no Python, so no GIL, on MXNet's threads) or, where it was not built,
a Python callback. Either way the operations run in submission order once their inputs are
written, the completion reaches the engine (``waitall`` returns), a failing one completes
too and its error reaches the caller's thread, and each is timed when recording."""
import mxnet as mx
import pytest

from kvhybrid.errors import KVHybridError
from kvhybrid.tensor_collectives import engine
from kvhybrid.tensor_collectives.group import Group, GroupSettings
from kvhybrid.tensor_collectives.ndarray_view import host_view


@pytest.fixture(scope="module")
def group():
    made = Group.world(GroupSettings(timeout=60), allow_singleton=True)
    yield made
    made.close()


@pytest.mark.parametrize("native", [True, False], ids=["c-helper", "python-callback"])
def test_operations_start_in_order_once_written_and_complete(group, native):
    comm = engine.EngineComm(group)
    if native:
        assert comm._native is not None, "scripts/setup.sh builds engine_start.cc"
    else:
        comm._native = None   # (as where the helper was not built)
    comm.record = True
    big, small = mx.nd.zeros((1 << 20,)), mx.nd.zeros((4,))
    one = mx.nd.ones((1 << 20,))
    for _ in range(10):   # writes the engine has not run yet when the first op is pushed
        mx.nd.elemwise_add(big, one, out=big)
    seen = []
    comm.submit("first", [big], lambda: seen.append(("first", float(host_view(big)[-1]))))
    comm.submit("second", [small], lambda: seen.append(("second", 0.0)))
    comm.submit("broken", [small], lambda: 1 / 0)
    mx.nd.waitall()   # returns: every operation completed, the failing one too
    assert seen == [("first", 10.0), ("second", 0.0)]
    assert [t.name for t in comm.timeline] == ["first", "second"]
    assert all(0 < t.ready <= t.begin <= t.end for t in comm.timeline)
    with pytest.raises(KVHybridError, match="broken"):
        comm.check()
    comm.close()


def test_rows_made_inside_the_operation_that_writes_them_reach_a_copy_queued_before(group):
    # a prefetching push's hand-out: the rows' array is made empty at the push, a pull's
    # copy of it is queued next, and only the operation knows how many rows it gets
    import numpy as np
    from kvhybrid.tensor_collectives.ndarray_view import (empty_row_sparse, engine_copy,
                                                        make_rows, rows_made_later)
    assert rows_made_later(), "scripts/setup.sh builds ndarray_aux.cc"
    comm = engine.EngineComm(group)
    gate, array = mx.nd.zeros((1 << 20,)), empty_row_sparse((12, 2), np.float32)
    for _ in range(10):   # the operation starts only once these have run
        mx.nd.elemwise_add(gate, mx.nd.ones((1 << 20,)), out=gate)

    def hand_out():
        rows = make_rows(array, np.array([1, 4, 9], np.int64))
        rows[:] = np.arange(6, dtype=np.float32).reshape(3, 2) + host_view(gate)[0]

    comm.submit("hand-out", [array], hand_out, reads=[gate])
    out = empty_row_sparse((12, 2), np.float32)
    assert engine_copy(array, out)   # queued before the operation gave the array its rows
    assert out.indices.asnumpy().tolist() == [1, 4, 9]
    assert out.data.asnumpy().tolist() == [[10, 11], [12, 13], [14, 15]]
    comm.close()


def test_an_out_holding_rows_takes_others_from_the_operation_that_writes_it(group):
    # a served pull into Gluon's weight: the out holds last step's rows; the operation gives
    # it this step's, and a read queued after it sees them (a read before, the old ones)
    import numpy as np
    from kvhybrid.tensor_collectives.ndarray_view import make_rows, takes_rows_in_place
    comm = engine.EngineComm(group)
    out = mx.nd.sparse.row_sparse_array((np.ones((2, 2), np.float32), np.array([0, 5])),
                                        shape=(12, 2))
    assert takes_rows_in_place(out, (12, 2), np.float32)
    # a copy instead: into a dense out, or one of another dtype or shape than the table's
    assert not takes_rows_in_place(mx.nd.zeros((12, 2)), (12, 2), np.float32)
    assert not takes_rows_in_place(out, (12, 2), np.float16)
    assert not takes_rows_in_place(out, (13, 2), np.float32)
    before = out * 1   # queued before: the old rows
    for count in (3, 1, 4):   # fewer rows than it held, then more (its memory grows)
        ids = np.arange(count, dtype=np.int64) * 2 + 1

        def serve():
            make_rows(out, ids)[:] = ids[:, None] * np.ones((1, 2), np.float32)

        comm.submit("served pull", [out], serve)
        after = out * 1
        want = np.zeros((12, 2), np.float32)
        want[ids] = ids[:, None]
        assert np.array_equal(after.asnumpy(), want), count
        assert out.indices.asnumpy().tolist() == ids.tolist()
    assert before.asnumpy()[[0, 5]].tolist() == [[1, 1], [1, 1]]
    comm.close()


def test_in_place_runs_the_job_now_once_its_inputs_are_written_and_cleans_up_after_a_failure():
    # a push where no communication thread runs: the same job, on the caller's thread
    big, one = mx.nd.zeros((1 << 20,)), mx.nd.ones((1 << 20,))
    for _ in range(10):   # writes the engine has not run yet when the job is handed over
        mx.nd.elemwise_add(big, one, out=big)
    seen = []
    engine.IN_PLACE.submit("job", [], lambda: seen.append(float(host_view(big)[-1])),
                           reads=[big], cleanup=lambda: seen.append("cleanup"))
    assert seen == [10.0, "cleanup"]   # (done before submit returned)
    with pytest.raises(ZeroDivisionError):
        engine.IN_PLACE.submit("broken", [], lambda: 1 / 0, cleanup=lambda: seen.append("again"))
    assert seen[-1] == "again"
