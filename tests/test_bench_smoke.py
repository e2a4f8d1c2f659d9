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


def test_sparse_pull_benchmark_measures_both_designs(tmp_path):
    cmd = [sys.executable, "-m", "kvhybrid.bench.sparse_pull", "--workers", "2", "--rows", "500",
           "--ids", "64", "--repeats", "2", "--warmup", "1", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    table = (tmp_path / "sparse_pull.md").read_text()
    assert "master pulls the union, scatters" in table and "every worker pulls its rows" in table
    results = json.loads((tmp_path / "sparse_pull.json").read_text())["results"]["2"]
    assert set(results) == {"master", "every"}
    assert all(r["pull_ms"] > 0 and r["rows_per_worker"] > 0 for r in results.values())
    assert (tmp_path / "sparse_pull.png").stat().st_size > 10_000


def test_fusion_benchmark_measures_every_case(tmp_path):
    cmd = [sys.executable, "-m", "kvhybrid.bench.fusion", "--keys", "8", "--key-kb", "4",
           "--ranks", "2", "--repeats", "2", "--warmup", "1", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads((tmp_path / "fusion.json").read_text())["results"]["2"]
    assert set(results) == {"store_per_key", "store_fused", "store_fused_views", "mpi_per_key",
                            "mpi_one_buffer", "horovod"}
    assert "fused (one buffer) speed-up over key by key" in (tmp_path / "fusion.md").read_text()
    assert (tmp_path / "fusion.png").stat().st_size > 10_000
