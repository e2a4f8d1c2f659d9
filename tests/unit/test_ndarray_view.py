"""Zero-copy host views of NDArray memory (one process; no MPI involved)."""
import gc
import sys

import numpy as np
import mxnet as mx
import pytest

from kvhybrid.tensor_collectives.ndarray_view import (_native_pull, copy_if_ids_equal,
                                                    empty_row_sparse, engine_copy, ids_address,
                                                    host_array, host_row_sparse,
                                                    host_view, ids_equal, ids_in_table_of,
                                                    is_host,
                                                    new_host_row_sparse,
                                                    reads_row_ids_in_place, row_sparse_ids,
                                                    wait_to_write)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "uint8"])
def test_view_shares_memory_both_ways(dtype):
    arr = mx.nd.arange(12, dtype=dtype).reshape((3, 4))
    wait_to_write(arr)
    view = host_view(arr)
    assert view.dtype == np.dtype(dtype) and view.shape == (12,)
    assert view.tolist() == list(range(12))
    view[5] = 42                      # a write through the view shows in the NDArray
    assert arr.asnumpy().reshape(-1)[5] == 42
    arr[:] = 7                        # and an engine write shows in the view, once waited for
    wait_to_write(arr)
    assert set(view.tolist()) == {7}


def test_view_keeps_its_ndarray_alive():
    # Otherwise a view of a temporary NDArray points into freed memory (heap corruption).
    arr = mx.nd.ones((1000,))
    wait_to_write(arr)
    before = sys.getrefcount(arr)
    view = host_view(arr)
    assert sys.getrefcount(arr) == before + 1, "the view holds no reference to its NDArray"
    del view
    gc.collect()
    assert sys.getrefcount(arr) == before


def test_empty_and_non_host_arrays():
    assert host_view(mx.nd.array(np.zeros(0))).size == 0
    assert is_host(mx.nd.zeros((1,), ctx=mx.cpu_pinned(0)))
    with pytest.raises(ValueError, match="dense"):
        host_view(mx.nd.zeros((4, 2)).tostype("row_sparse"))


@pytest.mark.parametrize("count", [0, 1, 37])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_host_row_sparse_equals_mxnets_row_sparse_array(count, dtype):
    rng = np.random.RandomState(count)
    ids = np.sort(rng.choice(100, count, replace=False)).astype(np.int64)
    rows = rng.rand(count, 3, 2).astype(np.float64)   # cast to the array's dtype
    ours = host_row_sparse(rows, ids, (100, 3, 2), dtype)
    theirs = mx.nd.sparse.row_sparse_array((rows, ids), shape=(100, 3, 2), dtype=dtype)
    assert ours.stype == "row_sparse" and ours.shape == (100, 3, 2) \
        and np.dtype(ours.dtype) == np.dtype(dtype)
    assert ours.indices.asnumpy().tolist() == ids.tolist()
    assert np.array_equal(ours.asnumpy(), theirs.asnumpy())
    out = mx.nd.sparse.zeros("row_sparse", (100, 3, 2), dtype=dtype)
    for _ in range(3):   # a temporary's handle freed too early crashed here (segfault)
        host_row_sparse(rows, ids, (100, 3, 2), dtype).copyto(out)
    assert np.array_equal(out.asnumpy(), theirs.asnumpy())


def test_new_host_row_sparse_is_filled_through_its_view():
    """The prefetched rows' hand-out writes a table's rows into this view, as bytes."""
    ids = np.array([2, 5, 9], np.int64)
    arr, rows = new_host_row_sparse(ids, (10, 4), np.float32)
    rows.reshape(-1).view(np.uint8)[:] = np.arange(12, dtype=np.float32).view(np.uint8)
    dense = arr.asnumpy()
    assert dense[[2, 5, 9]].tolist() == rows.tolist() == np.arange(12.0).reshape(3, 4).tolist()
    assert not dense[[0, 1, 3, 8]].any()
    assert arr.indices.asnumpy().tolist() == [2, 5, 9]


def test_host_array_copies_and_casts():
    values = np.arange(6, dtype=np.int32).reshape(2, 3)
    arr = host_array(values, np.int64)
    values[0, 0] = 99                 # a copy: the NDArray keeps what it was given
    assert arr.dtype == np.int64 and arr.asnumpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert host_array(np.zeros((0, 4), np.float32)).shape == (0, 4)


def _sparse_grad(ids, rows=100, width=4):
    emb = mx.gluon.nn.Embedding(rows, width, sparse_grad=True)
    emb.initialize()
    with mx.autograd.record():
        loss = emb(mx.nd.array(ids)).sum()
    loss.backward()
    return emb.weight.grad()


def test_row_ids_are_read_in_place_as_mxnet_gives_them():
    # scripts/setup.sh builds the C++ helper (pip install --no-build-isolation -e .): a
    # missing or wrong build must fail here, not only cost the step its engine round trip
    assert reads_row_ids_in_place()
    for ids in ([[3, 3, 50, 7]], [[99, 0], [0, 42]], [[5]]):
        grad = _sparse_grad(ids)   # (not waited for: row_sparse_ids waits)
        got = row_sparse_ids(grad)
        assert got.dtype == np.int64 and got.tolist() == grad.indices.asnumpy().tolist()
        assert got.tolist() == sorted(set(np.ravel(ids).tolist()))
    empty = mx.nd.sparse.zeros("row_sparse", (10, 3))
    assert row_sparse_ids(empty).tolist() == []


def test_row_ids_are_a_copy_that_outlives_the_next_backward():
    emb = mx.gluon.nn.Embedding(100, 4, sparse_grad=True)
    emb.initialize()
    seen = []
    for ids in ([[1, 2]], [[7, 8, 9]]):
        with mx.autograd.record():
            loss = emb(mx.nd.array(ids)).sum()
        loss.backward()
        seen.append(row_sparse_ids(emb.weight.grad()))
    assert [s.tolist() for s in seen] == [[1, 2], [7, 8, 9]]


def test_without_the_helper_row_ids_come_through_mxnet(monkeypatch):
    # a machine without a compiler (or KVHYBRID_CPP_HELPER=0): the same ids, the engine's way
    from kvhybrid.tensor_collectives import ndarray_view
    for found in ("_NATIVE", "_PULL", "_IDS"):
        monkeypatch.setattr(ndarray_view, found, [])
    monkeypatch.setattr(ndarray_view._HELPER, "loaded", [])
    monkeypatch.setenv("KVHYBRID_CPP_HELPER", "0")
    grad = _sparse_grad([[4, 1, 4]])
    assert not reads_row_ids_in_place() and not reads_row_ids_in_place(grad)
    assert row_sparse_ids(grad).tolist() == [1, 4]
    with pytest.raises(ValueError, match="reads_row_ids_in_place"):
        row_sparse_ids(grad, wait=False)
    # ids compared in numpy instead, rows copied through the _copyto operator
    assert ids_equal(mx.nd.array([1, 4]), np.array([1, 4], np.int64)) is None
    assert not engine_copy(grad, mx.nd.sparse.zeros("row_sparse", (100, 4)))
    handed = np.array([1, 4], np.int64)
    assert copy_if_ids_equal(mx.nd.array([1, 4]), handed, ids_address(handed), grad,
                             mx.nd.sparse.zeros("row_sparse", (100, 4))) is None
    assert ids_in_table_of(mx.nd.array([1, 4]), 100) is None   # (numpy reads them then)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "int8"])
def test_ids_are_compared_in_place_as_numpy_compares_them(dtype):
    ids = np.array([3, 0, 7, 7, 120], np.int64)
    for values in ([3, 0, 7, 7, 120], [3, 0, 7, 7, 121], [3, 0, 7, 7], [3, 0, 7, 7, 120, 1]):
        arr = mx.nd.array(values, dtype=dtype)
        expected = arr.asnumpy().shape == ids.shape and bool((arr.asnumpy() == ids).all())
        assert ids_equal(arr, ids) is expected, values
    # a batch of 2 x 3 ids, still being written by the engine: waited for, read flat
    batch = mx.nd.array([[1, 2, 3], [4, 5, 6]], dtype=dtype) * 1
    assert ids_equal(batch, np.arange(1, 7, dtype=np.int64)) is True


def test_ids_that_are_not_whole_or_not_readable_in_place():
    ids = np.array([2, 5], np.int64)
    assert ids_equal(mx.nd.array([2.5, 5], dtype="float64"), ids) is False
    assert ids_equal(mx.nd.array([2, 5], dtype="float16"), ids) is None   # (numpy's turn)
    rows = mx.nd.sparse.row_sparse_array((np.ones((2, 1), np.float32), ids), shape=(8, 1))
    assert ids_equal(rows, ids) is None
    assert ids_equal(mx.nd.array([2, 5]), ids.astype(np.int32)) is None


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_a_batchs_ids_are_read_in_place_as_numpys_cast(dtype):
    values = [[7, 0.9, 3], [7, 2, 9.5]] if dtype.startswith("float") else [[7, 0, 3], [7, 2, 9]]
    batch = mx.nd.array(values, dtype=dtype) * 1   # (written by the engine: waited for)
    got = ids_in_table_of(batch, 10)
    assert got.dtype == np.int64 and got.tolist() == np.array(values, dtype).astype(
        np.int64).reshape(-1).tolist()
    got[0] = 5   # (a copy: the batch's array keeps its ids)
    assert batch.asnumpy().reshape(-1)[0] == 7


def test_ids_outside_the_table_or_not_readable_in_place_are_left_to_numpy():
    assert ids_in_table_of(mx.nd.array([2, 10], dtype="int64"), 10) is None
    assert ids_in_table_of(mx.nd.array([-1, 2]), 10) is None
    assert ids_in_table_of(mx.nd.array([2, float("nan")]), 10) is None
    assert ids_in_table_of(mx.nd.array([2, 5], dtype="float16"), 10) is None
    assert ids_in_table_of(mx.nd.sparse.zeros("row_sparse", (10, 2)), 10) is None


def test_a_batch_larger_than_any_before_gets_room_for_its_ids():
    many = np.random.RandomState(0).randint(0, 10**6, size=100_000)
    assert ids_in_table_of(mx.nd.array(many, dtype="int64"), 10**6).tolist() == many.tolist()
    assert ids_in_table_of(mx.nd.array([3, 1], dtype="int64"), 10).tolist() == [3, 1]


def test_an_empty_row_sparse_array_is_mxnets_own_and_each_call_makes_a_new_one():
    from mxnet.ndarray.sparse import RowSparseNDArray, _new_alloc_handle
    for shape, dtype in [((12, 2), np.float32), ([7, 3, 2], np.float64), ((5, 4), np.float16)]:
        want = RowSparseNDArray(_new_alloc_handle("row_sparse", tuple(shape), mx.cpu(), True,
                                                  np.dtype(dtype), [np.int64], [(0,)]))
        made, again = empty_row_sparse(shape, dtype), empty_row_sparse(shape, dtype)
        assert made.handle.value != again.handle.value   # (the arguments are reused, not it)
        for got in (made, again):
            assert (got.shape, got.dtype, got.stype, got.context) == \
                (want.shape, want.dtype, want.stype, want.context)
            assert got.indices.dtype == np.int64 and got.indices.shape == (0,)
            assert np.array_equal(got.asnumpy(), want.asnumpy())
    rows = mx.nd.sparse.row_sparse_array((np.ones((1, 2), np.float32), np.array([3])),
                                         shape=(12, 2))
    made = empty_row_sparse((12, 2), np.float32)
    rows.copyto(made)   # (sized by what writes it; the next one made is still empty)
    assert made.indices.asnumpy().tolist() == [3]
    assert empty_row_sparse((12, 2), np.float32).indices.shape == (0,)


def test_rows_are_copied_by_mxnets_copy_from_to():
    assert _native_pull() is not None   # (a build that lost it must fail here)
    rows = mx.nd.sparse.row_sparse_array((np.arange(6, dtype=np.float32).reshape(3, 2),
                                          np.array([1, 4, 9], np.int64)), shape=(12, 2))
    out = empty_row_sparse((12, 2), np.float32)
    assert engine_copy(rows, out)
    assert out.indices.asnumpy().tolist() == [1, 4, 9]
    assert np.array_equal(out.asnumpy(), rows.asnumpy())
    dense = mx.nd.zeros((12, 2))
    assert engine_copy(rows, dense) and np.array_equal(dense.asnumpy(), rows.asnumpy())
    # shapes that differ: MXNet refuses, the helper says so instead of raising through ctypes
    assert not engine_copy(rows, mx.nd.zeros((3, 2)))


def test_a_prefetched_pull_compares_and_copies_in_one_call():
    rows = mx.nd.sparse.row_sparse_array((np.arange(6, dtype=np.float32).reshape(3, 2),
                                          np.array([1, 4, 9], np.int64)), shape=(12, 2))
    handed = np.array([9, 1, 4], np.int64)
    out = empty_row_sparse((12, 2), np.float32)
    at = ids_address(handed)
    # other ids: nothing copied; the handed ones (a float batch, being written): copied
    assert copy_if_ids_equal(mx.nd.array([9, 1, 5]), handed, at, rows, out) is False
    assert out.asnumpy().sum() == 0
    assert copy_if_ids_equal(mx.nd.array([9, 1, 4]) * 1, handed, at, rows, out) is True
    assert np.array_equal(out.asnumpy(), rows.asnumpy())
    # where the helper cannot tell or copy: None, nothing done (the caller's own way then)
    assert ids_address(handed.astype(np.int32)) is None
    assert copy_if_ids_equal(mx.nd.array([9, 1, 4]), handed, None, rows, out) is None
    assert copy_if_ids_equal(mx.nd.array([9, 1, 4], dtype="float16"), handed, at, rows,
                             out) is None
    assert copy_if_ids_equal(mx.nd.array([9, 1, 4]), handed, at, rows,
                             mx.nd.zeros((3, 2))) is None


def test_view_cache_looks_up_where_an_array_lies_once(monkeypatch):
    from kvhybrid.tensor_collectives import ndarray_view
    cache = ndarray_view.ViewCache()
    host, device = mx.nd.arange(6), mx.nd.arange(6)
    wait_to_write(host)
    asked = []
    monkeypatch.setattr(ndarray_view, "is_host",   # (no accelerator here: one is pretended)
                        lambda arr: asked.append(arr) or arr is not device)
    for _ in range(3):
        view = cache.host(host, np.float32, 6)
        assert view is not None and view.tolist() == list(range(6))
        assert cache.host(device, np.float32, 6) is None
    assert asked == [host, device]
