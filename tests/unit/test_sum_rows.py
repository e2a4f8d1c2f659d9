"""The master's sum of its group's rows (one process; no MPI involved)."""
import numpy as np
import pytest

from kvhybrid.tensor_collectives.rows import sum_rows


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_sum_rows_sums_every_copy_of_an_id_once(ranks):
    rng = np.random.RandomState(ranks)
    # each rank sends sorted unique ids, as local_rows does; ids repeat across ranks
    ids = np.concatenate([np.unique(rng.randint(0, 30, 20)) for _ in range(ranks)])
    rows = rng.rand(len(ids), 2, 3).astype(np.float32)
    unique, total = sum_rows(ids, rows)
    want = {}
    for i, r in zip(ids.tolist(), rows):
        want[i] = want.get(i, 0) + r.astype(np.float64)
    assert unique.tolist() == sorted(want)
    assert total.shape == (len(want), 2, 3) and total.dtype == np.float32
    for i, t in zip(unique.tolist(), total):
        np.testing.assert_allclose(t, want[i], rtol=1e-6)


def test_sum_rows_of_nothing():
    ids, rows = np.zeros(0, np.int64), np.zeros((0, 4), np.float32)
    unique, total = sum_rows(ids, rows)
    assert unique.shape == (0,) and total.shape == (0, 4)
