"""mpi-ASGD ('hybrid-mpi-async'): groups sum synchronously with MPI, meet asynchronously on servers."""
import json
import math

from mpirun import run_launcher


def test_async_store_trains_across_groups(tmp_path):
    out = tmp_path / "async.json"
    r = run_launcher(["-n", 4, "--clients", 2, "--servers", 2], "train_budget.py",
                     ["hybrid-mpi-async", out], timeout=240)
    assert r.returncode == 0, r.output[-4000:]
    result = json.load(open(out))
    assert result["type"] == "dist_async_hybrid-mpi"   # Gluon sees 'async': updates on the store
    assert result["loss"] < 0.9 * math.log(10), f"did not train: loss {result['loss']:.3f}"
