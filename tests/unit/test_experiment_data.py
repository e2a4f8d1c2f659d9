"""The experiments' digits (``experiments/data/digits.npz``) are scikit-learn's, so the
digits task gives the same data where scikit-learn is missing (the 16-core machine's pack)."""
import numpy as np
from sklearn.datasets import load_digits   # a test dependency

from experiments.tasks import DIGITS


def test_the_kept_digits_are_scikit_learns():
    theirs = load_digits()
    with np.load(DIGITS) as ours:
        assert ours["images"].dtype == np.uint8 and ours["labels"].dtype == np.uint8
        np.testing.assert_array_equal(ours["images"], theirs.data)
        np.testing.assert_array_equal(ours["labels"], theirs.target)


def test_the_digits_task_loads_without_scikit_learn(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "sklearn", None)   # an import of it now fails
    from experiments.tasks import digits
    task = digits()
    (x, y), (vx, vy) = task.train, task.valid
    assert x.shape == (1437, 64) and vx.shape == (360, 64)
    assert x.max() == 1.0 and set(np.unique(y)) == set(range(10))
