"""The pushpull benchmark runs end to end (tiny sizes) and writes its table and plot.

It asserts no timing: it checks that every peer was measured and reported.
"""
import json
import subprocess
import sys

from mpirun import ROOT, job_env


def test_pushpull_benchmark_writes_table_json_and_plot(tmp_path):
    cmd = [sys.executable, "-m", "kvhybrid.bench.pushpull", "--sizes-mb", "0.25", "--repeats", "2",
           "--warmup", "1", "--variants", "default", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    table = (tmp_path / "pushpull.md").read_text()
    for column in ("hybrid-mpi pushpull", "MPI Allreduce in place", "Horovod allreduce_",
                   "dist_sync push+pull", "memcpy"):
        assert column in table
    results = json.loads((tmp_path / "pushpull.json").read_text())["default"]["0.25"]
    assert {"hybrid_pushpull_inplace", "mpi_allreduce_inplace", "horovod_allreduce",
            "dist_sync_push_pull"} <= set(results)
    assert (tmp_path / "pushpull.png").stat().st_size > 10_000
