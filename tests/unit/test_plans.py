"""The plans the store makes before anything moves, checked without MPI: how a call's
arguments pair keys with arrays, how dense keys are cut into fusion buckets and packs, and
where a table's pieces live among ps-lite's keys."""
import mxnet as mx
import numpy as np
import pytest

from kvhybrid.errors import KeyValueError
from kvhybrid.kvstore.ps import link, packs
from kvhybrid.kvstore.keys import check_out, pairs
from kvhybrid.tensor_collectives.fusion import buckets

F32, F16 = np.dtype("float32"), np.dtype("float16")


# -- argument pairing (MXNet's key, value conventions) -----------------------------------------
def test_one_key_and_one_array_make_one_pair():
    a = mx.nd.zeros((2, 3))
    [(key, arrays)] = pairs(np.int64(7), a)
    assert key == 7 and type(key) is int and arrays == [a]


def test_a_list_of_keys_pairs_each_with_its_devices_arrays():
    a, b = mx.nd.zeros((2,)), mx.nd.ones((2,))
    got = pairs(["w", "v"], [[a, b], a])
    assert [(k, len(v)) for k, v in got] == [("w", 2), ("v", 1)]


@pytest.mark.parametrize("key,value,says", [
    ([1, 2], [mx.nd.zeros(1)], "a list of 2 keys needs a list of 2 values, got list of length 1"),
    ([1, 1], [mx.nd.zeros(1)] * 2, "repeat a key"),
    (True, mx.nd.zeros(1), "key must be an int or a str, got bool"),
    (1.5, mx.nd.zeros(1), "key must be an int or a str, got float"),
    (1, [], "must be an NDArray or a non-empty list"),
    (1, [mx.nd.zeros(2), mx.nd.zeros(3)], "every device's copy of a key must have the same shape"),
    (1, mx.nd.zeros((4, 2)).tostype("row_sparse"), "is row_sparse"),
])
def test_bad_arguments_are_named_with_the_fix(key, value, says):
    with pytest.raises(KeyValueError) as err:
        pairs(key, value)
    assert says in str(err.value)


def test_row_sparse_arrays_pass_where_the_call_takes_them():
    rsp = mx.nd.zeros((4, 2)).tostype("row_sparse")
    assert pairs(1, rsp, sparse_ok=True)[0][1] == [rsp]


def test_out_must_match_value_array_for_array():
    v = [mx.nd.zeros((2,)), mx.nd.zeros((2,))]
    check_out(1, v, [mx.nd.zeros((2,)), mx.nd.zeros((2,))])
    with pytest.raises(KeyValueError, match="one out array per value array"):
        check_out(1, v, v[:1])
    with pytest.raises(KeyValueError, match="out arrays of the value's shape"):
        check_out(1, v, [mx.nd.zeros((2,)), mx.nd.zeros((3,))])
    # another dtype is cast into, as a pull's outs are
    check_out(1, v, [mx.nd.zeros((2,), dtype="float16"), mx.nd.zeros((2,), dtype="float64")])


# -- fusion buckets -----------------------------------------------------------------------------
def test_buckets_fill_up_to_the_threshold_in_order():
    assert buckets([40, 40, 40, 40], [F32] * 4, threshold=100) == [[0, 1], [2, 3]]


def test_a_dtype_change_or_a_big_tensor_starts_a_bucket_of_its_own():
    assert buckets([10, 10, 500, 10, 10], [F32, F16, F16, F16, F16], threshold=100) == \
        [[0], [1], [2], [3, 4]]


def test_the_first_bucket_is_small_so_the_first_gradients_move_early():
    # PyTorch DDP's plan: a first bucket of at most first_threshold, then threshold
    got = buckets([30] * 8, [F32] * 8, threshold=100, first_threshold=60)
    assert got == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert buckets([30] * 8, [F32] * 8, threshold=100) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_every_tensor_is_in_exactly_one_bucket_within_its_limit():
    rng = np.random.default_rng(0)
    sizes = list(rng.integers(1, 300, size=200))
    dtypes = [F32 if x < 0.7 else F16 for x in rng.random(200)]
    got = buckets(sizes, dtypes, threshold=512, first_threshold=128)
    assert [i for b in got for i in b] == list(range(200))
    for n, b in enumerate(got):
        assert len({dtypes[i] for i in b}) == 1
        assert len(b) == 1 or sum(sizes[i] for i in b) <= (128 if n == 0 else 512)


# -- packs of small keys for the servers ----------------------------------------------------------
def test_packs_group_small_keys_after_a_presence_mask():
    runs = packs.plan([("a", 1, 10), ("b", 2, 20), ("c", 3, 5)], limit=100)
    assert [[(m.key, m.start, m.end) for m in run] for run in runs] == \
        [[("a", 3, 13), ("b", 13, 33), ("c", 33, 38)]]


def test_a_pack_stays_below_the_limit_and_big_or_lone_keys_stay_unpacked():
    items = [(f"k{i}", i, 30) for i in range(6)] + [("big", 99, 500), ("lone", 100, 10)]
    runs = packs.plan(items, limit=100)
    packed = [m.key for run in runs for m in run]
    assert "big" not in packed and "lone" not in packed   # too big; alone after "big"
    assert sorted(packed) == [f"k{i}" for i in range(6)]
    for run in runs:
        assert len(run) >= 2 and run[-1].end < 100      # mask + values below the limit
        assert run[0].start == len(run)                  # the mask comes first
        assert all(a.end == b.start for a, b in zip(run, run[1:]))


# -- where a table's pieces live among ps-lite's keys ---------------------------------------------
def test_piece_keys_never_collide_and_stay_below_mxnets_server_hash_limit():
    half = link.PIECE_STRIDE // 2
    ids = list(range(half)) + list(range(link.STR_KEY_BASE, link.STR_KEY_BASE + half))
    seen = {}
    for index in ids:
        for piece in range(link.MAX_PARTITIONS):
            kid = link.piece_key(index, piece)
            assert kid is not None and kid not in seen, (index, piece, seen.get(kid))
            seen[kid] = (index, piece)
    assert max(seen) < link.PACK_KEY_BASE < link.PACK_KEY_END == 2 ** 31 // 9973
    assert min(seen) >= link.ROWS_KEY_BASE > link.PROBE_KEY_TOP   # above every dense key


def test_a_key_id_without_room_for_pieces_is_told_not_mapped_elsewhere():
    assert link.piece_key(link.PIECE_STRIDE, 0) == link.ROWS_KEY_BASE + link.PIECE_STRIDE
    assert link.piece_key(link.PIECE_STRIDE, 1) is None


def test_piece_bounds_cover_every_row_once():
    bounds = link.piece_bounds(10, 3)
    assert bounds.tolist() == [0, 3, 6, 10]
    assert link.piece_bounds(5, 1).tolist() == [0, 5]
