"""The master's arithmetic on its group's rows (one process; no MPI involved): the sum of
the ranks' rows by id, the union of their next ids and each rank's rows taken from the
servers' answer, each made by the C++ helper (rows.cc) with numpy's bits, and by numpy
where the helper cannot (ids not sorted per rank, a dtype it lacks, the helper off); and
a batch's ids as ``prefetch_rows`` copies and checks them (ids.cc, else numpy)."""
import mxnet as mx
import numpy as np
import pytest

from kvhybrid.errors import KeyValueError
from kvhybrid.kvstore.sparse_push import _ids_of_table as ids_of_table
from kvhybrid.tensor_collectives import rows as rows_module
from kvhybrid.tensor_collectives.rows import (ids_in_table, sum_rows, take_rows, union_ids,
                                              unique_ids)


def _ranks(ranks: int, seed: int, vocab: int = 30, each: int = 20):
    """Each rank's sorted unique ids (as local_rows reads one gradient's), concatenated, and
    the counts; ids repeat across ranks."""
    rng = np.random.RandomState(seed)
    parts = [np.unique(rng.randint(0, vocab, each)) for _ in range(ranks)]
    if ranks > 1:
        parts[1] = parts[1][:0]   # a rank that touched no row
    return np.concatenate(parts).astype(np.int64), np.array([len(p) for p in parts])


def _not_numpy(*args, **kwargs):
    raise AssertionError("numpy summed what the helper should have")


def _numpy_sum(ids, rows):
    """sum_rows as numpy makes it (no counts: the helper is not asked)."""
    return sum_rows(ids, rows)


@pytest.fixture(params=["helper", "numpy"])
def helper(request, monkeypatch):
    """Each test runs with the helper and with it switched off (KVHYBRID_CPP_HELPER=0)."""
    if request.param == "numpy":
        monkeypatch.setattr(rows_module._HELPER, "loaded", [None])
        monkeypatch.setattr(rows_module._IDS, "loaded", [None])
    else:   # scripts/setup.sh builds it
        assert rows_module._helper() is not None, "rows.cc was not built: run scripts/setup.sh"
    return request.param


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_sum_rows_sums_every_copy_of_an_id_once(ranks, helper):
    ids, counts = _ranks(ranks, ranks)
    rows = np.random.RandomState(7).rand(len(ids), 2, 3).astype(np.float32)
    unique, total = sum_rows(ids, rows, counts)
    want = {}
    for i, r in zip(ids.tolist(), rows):
        want[i] = want.get(i, 0) + r.astype(np.float64)
    assert unique.tolist() == sorted(want)
    assert total.shape == (len(want), 2, 3) and total.dtype == np.float32
    for i, t in zip(unique.tolist(), total):
        np.testing.assert_allclose(t, want[i], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_the_helpers_sum_has_numpys_bits(dtype, helper):
    ids, counts = _ranks(5, 11, vocab=200, each=150)
    rows = (np.random.RandomState(3).standard_normal((len(ids), 7)) * 1e3).astype(dtype)
    with pytest.MonkeyPatch.context() as patch:
        if helper == "helper" and dtype != np.float16:   # (numpy's sort is not reached)
            patch.setattr(rows_module.np, "argsort", _not_numpy)
        unique, total = sum_rows(ids, rows, counts)
    want_ids, want = _numpy_sum(ids, rows)
    assert unique.tolist() == want_ids.tolist() and total.dtype == want.dtype
    assert total.tobytes() == want.tobytes()


def test_ids_not_sorted_per_rank_are_summed_by_numpy(helper):
    # several devices' arrays of one rank, concatenated: the helper declines, numpy sums
    ids = np.array([5, 1, 9, 1, 5], np.int64)
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    unique, total = sum_rows(ids, rows, np.array([5]))
    assert unique.tolist() == [1, 5, 9]
    assert total.tolist() == [[2 + 6, 3 + 7], [0 + 8, 1 + 9], [4, 5]]


def test_sum_rows_of_nothing(helper):
    ids, rows = np.zeros(0, np.int64), np.zeros((0, 4), np.float32)
    unique, total = sum_rows(ids, rows, np.zeros(3, np.int64))
    assert unique.shape == (0,) and total.shape == (0, 4)


def test_union_ids_is_numpys_unique(helper):
    ids, counts = _ranks(4, 5, vocab=100, each=60)
    assert union_ids(ids, counts).tolist() == np.unique(ids).tolist()
    assert union_ids(np.array([3, 1, 2, 3], np.int64), np.array([4])).tolist() == [1, 2, 3]
    assert union_ids(np.zeros(0, np.int64), np.zeros(2, np.int64)).tolist() == []


@pytest.mark.parametrize("rows", [50_000, 10**12])   # a bitmap of the span, or a sort
def test_unique_ids_is_numpys_unique(rows, helper):
    rng = np.random.default_rng(rows % 97)
    handed = np.minimum(rng.zipf(1.1, size=1600) - 1, rows - 1).astype(np.int64)
    if rows > 10**6:
        handed = handed * (rows // 60_000)   # (spread over the whole table)
    assert unique_ids(handed, rows).tolist() == np.unique(handed).tolist()
    assert unique_ids(np.array([0, rows - 1, 0], np.int64), rows).tolist() == [0, rows - 1]
    assert unique_ids(np.zeros(0, np.int64), rows).tolist() == []


def test_unique_ids_of_ids_in_order_are_those_ids(helper):
    every = np.arange(1000, dtype=np.int64)   # (a pull of every row)
    got = unique_ids(every, 1000)
    assert got.tolist() == every.tolist() and got is not every
    assert unique_ids(np.array([0, 1, 1, 2], np.int64), 1000).tolist() == [0, 1, 2]
    assert unique_ids(np.array([2, 5, 4], np.int64), 1000).tolist() == [2, 4, 5]
    if helper == "helper":   # (ids in order outside the table are refused all the same)
        out = np.empty(2, np.int64)
        assert rows_module._helper().kvhybrid_unique_ids(
            np.array([3, 10], np.int64).ctypes.data, 2, 10, out.ctypes.data) == -1


def test_unique_ids_outside_the_table_are_left_to_numpy():
    lib = rows_module._helper()
    assert lib is not None, "rows.cc was not built: run scripts/setup.sh"
    out = np.empty(2, np.int64)
    for bad in ([3, -1], [3, 10]):
        bad = np.array(bad, np.int64)
        assert lib.kvhybrid_unique_ids(bad.ctypes.data, 2, 10, out.ctypes.data) == -1
    assert unique_ids(np.array([12, 3, 12], np.int64), 10).tolist() == [3, 12]


def test_take_rows_takes_each_ranks_rows_to_its_offset(helper):
    have = np.array([2, 4, 7, 8, 11], np.int64)
    table = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    wanted = np.array([4, 8, 11, 2, 11], np.int64)   # rank 0: 3 rows, 1: none, 2: 2
    counts = np.array([3, 0, 2])
    send = np.zeros(8 + 3 * 12 + 8 + 8 + 2 * 12, np.uint8)   # (behind headers, as the hand-out's)
    offsets = np.array([8, 8 + 36 + 8, 8 + 36 + 8 + 8])
    take_rows(have, table, wanted, counts, send, offsets)
    assert send[8:44].view(np.float32).reshape(3, 3).tolist() == table[[1, 3, 4]].tolist()
    assert send[60:].view(np.float32).reshape(2, 3).tolist() == table[[0, 4]].tolist()
    assert not send[:8].any() and not send[44:60].any()


def test_ids_outside_the_table_are_not_taken_by_the_helper():
    # the helper declines ids the table lacks (numpy would take a neighbour's row: the
    # hand-out never asks for one, its union holds every rank's ids)
    lib = rows_module._helper()
    assert lib is not None, "rows.cc was not built: run scripts/setup.sh"
    have, table = np.array([2, 4], np.int64), np.ones((2, 1), np.float32)
    out, offsets = np.zeros(8, np.uint8), np.zeros(1, np.int64)
    for wanted in ([3], [4, 2]):
        wanted, counts = np.array(wanted, np.int64), np.array([len(wanted)], np.int64)
        assert lib.kvhybrid_take_rows(have.ctypes.data, 2, table.ctypes.data, 4, 1,
                                      wanted.ctypes.data, counts.ctypes.data, out.ctypes.data,
                                      offsets.ctypes.data) == -1


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_ids_in_table_are_numpys_cast_of_the_batch(dtype):
    assert rows_module._IDS.library() is not None, "ids.cc was not built: run scripts/setup.sh"
    batch = np.array([[3, 0, 7], [9, 1, 3]], dtype)
    got = ids_in_table(batch, 10)
    assert got.dtype == np.int64 and got.tolist() == [3, 0, 7, 9, 1, 3]
    assert got.base is None or got.base is not batch   # (a copy: the batch is the caller's)
    assert ids_in_table(np.array([-0.5, 2.7]), 10).tolist() == [0, 2]   # (numpy truncates)
    assert ids_in_table(np.zeros(0, dtype), 10).tolist() == []


@pytest.mark.parametrize("batch", [[3, -1], [3, 10], [np.nan, 1.0], [np.inf, 1.0], [-1.0, 2.0]])
def test_ids_outside_the_table_are_left_to_numpy(batch):
    # (numpy then names the bad id: RowPushes.prefetch_rows)
    assert ids_in_table(np.array(batch), 10) is None


def test_ids_the_helper_cannot_read_are_left_to_numpy(helper):
    for batch in (np.arange(4, dtype=np.uint8), np.arange(8)[::2], np.arange(4).astype(">i8")):
        assert ids_in_table(batch, 10) is None
    got = ids_in_table(np.arange(4, dtype=np.int64), 10)   # (KVHYBRID_CPP_HELPER=0: numpy's)
    assert (got is None) == (helper == "numpy")


@pytest.mark.parametrize("batch,bad", [([4, -1, 2], -1), ([4, 10, 2], 10), ([0.5, 12.0], 12)])
def test_prefetch_rows_names_an_id_outside_the_table(batch, bad, helper):
    with pytest.raises(KeyValueError, match=rf"prefetch_rows of key 3 got row id {bad}, "
                                            r"outside the table's 10 rows: pass ids in \[0, 10\)"):
        ids_of_table(3, np.array(batch), 10)
    with pytest.raises(KeyValueError, match=rf"prefetch_rows of key 3 got row id {bad}, "):
        ids_of_table(3, mx.nd.array(batch, dtype="float64"), 10)   # (the helper leaves it)
    assert ids_of_table(3, [[4, 0], [2, 9]], 10).tolist() == [4, 0, 2, 9]
    assert ids_of_table(3, mx.nd.array([4, 0, 2]), 10).tolist() == [4, 0, 2]
