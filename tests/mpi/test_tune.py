"""kvhybrid-launch --tune-partitions: samples real jobs, fits, remembers, and the next run of
the same job starts with the result."""
import json
import sys

import pytest

from kvhybrid.launch import tune
from tests.support.jobs import WORKERS, _run_killable


def launch(*args, env=None, timeout=300):
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli", *map(str, args)]
    return _run_killable(cmd, f"kvhybrid-launch {args}", timeout, env)


def test_step_time_drops_warmup_and_needs_enough_steps(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"step_seconds": [9.0, 9.0, 9.0, 0.1, 0.3, 0.2]}))
    assert tune.step_time(str(f)) == pytest.approx(0.2)
    f.write_text(json.dumps({"step_seconds": [0.1, 0.2]}))
    with pytest.raises(ValueError, match="run more steps"):
        tune.step_time(str(f))


def test_cache_is_per_job_signature(tmp_path, monkeypatch):
    monkeypatch.setenv("KVHYBRID_CACHE_DIR", str(tmp_path))
    a = tune.signature(["python", "train.py"], 4, 1, 2)
    b = tune.signature(["python", "train.py"], 4, 2, 2)
    assert a != b and tune.remembered(a) is None
    tune.remember(a, {"partitions": 3})
    assert tune.remembered(a) == 3 and tune.remembered(b) is None


def test_tuning_runs_the_job_fits_and_the_next_run_starts_tuned(tmp_path):
    env = {"KVHYBRID_CACHE_DIR": str(tmp_path / "cache")}
    job = ["-n", 2, "--servers", 1, "python", WORKERS / "train_sparse.py", tmp_path, 1, 8, 5,
           "weight"]
    r = launch("--tune-partitions", "--tune-samples", 3, "--tune-out", tmp_path, *job, env=env)
    assert r.returncode == 0, r.output[-4000:]
    assert "tune 1/3: running the job with KVHYBRID_PARTITIONS=1" in r.output
    assert r.output.count("ms per step (job took") == 3, r.output[-4000:]
    assert "partition tuning: 3 settings sampled; t(P) =" in r.output
    (entry,) = json.load(open(tmp_path / "cache" / "partitions.json")).values()
    assert len(entry["samples"]) == 3 and len(entry["theta"]) == 3
    assert (tmp_path / "partitions_tuning.png").stat().st_size > 10_000
    chosen = entry["partitions"]
    again = launch(*job, env=env)
    assert again.returncode == 0, again.output[-4000:]
    assert f"KVHYBRID_PARTITIONS={chosen}, from an earlier --tune-partitions" in again.output


def test_tuning_needs_servers_and_three_samples():
    r = launch("-n", 2, "--tune-partitions", "python", "examples/train_mlp.py", timeout=60)
    assert r.returncode == 2 and "this job has none: add --servers" in r.output
    r = launch("-n", 2, "--servers", 1, "--tune-partitions", "--tune-samples", 2, "python",
               "examples/train_mlp.py", timeout=60)
    assert r.returncode == 2 and "--tune-samples must be at least 3" in r.output
