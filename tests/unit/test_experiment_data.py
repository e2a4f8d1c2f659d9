"""The experiments' digits (``experiments/data/digits.npz``) are scikit-learn's, so the
digits task gives the same data where scikit-learn is missing (the 16-core machine's pack).
scikit-learn lies under ``.venv/sklearn`` (scripts/run_tests.sh), off the jobs' path: it is
read in a process of its own."""
import os
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from experiments.tasks import DIGITS
from tests.support.jobs import ROOT

PREFIX = ROOT / ".venv" / "sklearn"
SITE = sysconfig.get_path("purelib", vars={"base": str(PREFIX), "platbase": str(PREFIX)})


@pytest.mark.skipif(not os.path.isdir(os.path.join(SITE, "sklearn")),
                    reason=f"scikit-learn is not installed under {PREFIX}: run "
                           "scripts/run_tests.sh, which installs it there")
def test_the_kept_digits_are_scikit_learns(tmp_path):
    theirs = tmp_path / "theirs.npz"
    code = ("import sys, numpy as np\n"
            "from sklearn.datasets import load_digits\n"
            "d = load_digits()\n"
            "np.savez(sys.argv[1], data=d.data, target=d.target)")
    r = subprocess.run([sys.executable, "-c", code, str(theirs)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": SITE})
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(DIGITS) as ours, np.load(theirs) as sk:
        assert ours["images"].dtype == np.uint8 and ours["labels"].dtype == np.uint8
        np.testing.assert_array_equal(ours["images"], sk["data"])
        np.testing.assert_array_equal(ours["labels"], sk["target"])


def test_the_digits_task_loads_without_scikit_learn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)   # an import of it now fails
    from experiments.tasks import digits
    task = digits()
    (x, y), (vx, vy) = task.train, task.valid
    assert x.shape == (1437, 64) and vx.shape == (360, 64)
    assert x.max() == 1.0 and set(np.unique(y)) == set(range(10))
