"""kvhybrid-launch --tune: real trial jobs in several shapes, a table, a pick the job then
runs in, a failed shape skipped with its reason, the pick remembered for the next runs, and
the budget honoured."""
import json
import re

from kvhybrid.launch import shape_tune
from tests.mpi.test_tune import launch
from tests.support.jobs import WORKERS


def sparse_job(script, out):
    """A tiny model with a SparseEmbedding, 12 steps a worker."""
    return ["-n", 2, "python", WORKERS / script, out, 1, 12, 5, "weight"]


def dense_args(out) -> list:
    """``train_budget.py``'s arguments for a tiny MLP (dense keys only): a trial trains until
    the tuner stops it, the job in the chosen shape one epoch of a hundred small steps a
    worker."""
    return ["hybrid-mpi", out / "loss.json", "mlp", 1, "until-stopped"]


def dense_job(out):
    return ["-n", 2, "python", WORKERS / "train_budget.py", *dense_args(out)]


def shape_entry(cache):
    entries = json.load(open(cache / "partitions.json")).values()
    (entry,) = [e for e in entries if "shape" in e]
    return entry


def assert_tuned_then_ran(output: str, cache, hosts=()) -> tuple:
    """A --tune's trials were each stopped once rank 0's store had written its steps, the
    fastest was chosen and remembered, and the job then ran in it, with client groups on
    each of ``hosts``: (the shape, the measured trials)."""
    entry = shape_entry(cache)
    chosen = shape_tune.Shape(**entry["shape"])
    measured = [t for t in entry["trials"] if t["status"] == "measured"]
    runs = sum(len(t["runs_ms"]) for t in measured)   # (the best's repeat among them)
    assert len(measured) <= runs <= entry["trial_count"] <= shape_tune.MAX_TRIALS, \
        output[-4000:]
    steps = shape_tune.tune.WARMUP_STEPS + shape_tune.TRIAL_STEPS + 1
    assert output.count(f" s, {steps} steps)") == runs, output[-4000:]
    assert entry["ms_per_step"] == min(t["ms_per_step"] for t in measured)
    assert f"chosen: {chosen.describe()}" in output
    assert output.rindex("the job finished") > output.index("chosen:"), output[-4000:]
    after = output[output.index("chosen:"):]
    assert f"{chosen.clients} client group(s)" in after
    clients = [line for line in after.splitlines() if line.startswith("client ")]
    for host in hosts:
        assert any(host in line for line in clients), (host, clients)
    return chosen, measured


def test_tune_tries_shapes_picks_one_runs_in_it_and_later_runs_start_there(tmp_path):
    env = {"KVHYBRID_CACHE_DIR": str(tmp_path / "cache")}
    r = launch("--tune", *dense_job(tmp_path), env=env)
    assert r.returncode == 0, r.output[-4000:]
    assert "| trial | shape | ms per step | result |" in r.output
    # the opening's two extremes, in order; either may be the best and so be repeated later
    for row in (r"\| 1(, \d)? \| 1 group, 0 servers \(pure MPI\) \|",
                r"\| 2(, \d)? \| 2 groups, 1 server \|"):
        assert re.search(row, r.output), r.output[-4000:]
    # no row_sparse keys: one group's servers would have nothing to hold, nor partitions
    assert "dense-only model (no row_sparse keys in the trials' stats)" in r.output
    assert "| – | 1 group, 1 server | – | pruned: dense-only model" in r.output
    assert "partitions: not searched" in r.output
    chosen, measured = assert_tuned_then_ran(r.output, tmp_path / "cache")
    assert len(measured) >= 2

    again = launch(*dense_job(tmp_path), env=env)
    assert again.returncode == 0, again.output[-4000:]
    assert f"shape {chosen.describe()}, from an earlier --tune of this job" in again.output

    # a later --tune starts from the remembered shape; a budget of a second lets the first
    # trial end and starts no other
    r = launch("--tune", "--tune-budget", 1, *dense_job(tmp_path), env=env)
    assert r.returncode == 0, r.output[-4000:]
    assert f"starting from this job's remembered shape, {chosen.describe()}" in r.output
    assert f"tune 1/6: {chosen.describe()} ..." in r.output and "tune 2/6" not in r.output
    assert "1 trials of 5 allowed shapes; stopped: the budget (1 s;" in r.output
    assert "of the 1 s budget" in r.output


def test_a_failing_shape_is_skipped_with_its_reason_and_the_search_goes_on(tmp_path):
    env = {"KVHYBRID_CACHE_DIR": str(tmp_path / "cache")}
    r = launch("--tune", *sparse_job("train_without_servers.py", tmp_path), env=env)
    assert r.returncode == 0, r.output[-4000:]
    assert "| 2 | 2 groups, 1 server | – | failed: exit code 3: client" in r.output, \
        r.output[-4000:]
    assert "(last output: this job cannot run with parameter servers)" in r.output
    assert "going on with the next shape" in r.output
    assert "chosen: 1 group, 0 servers (pure MPI)" in r.output
    assert "row_sparse keys found in the trials' stats" in r.output
    assert "partitions: not searched (the chosen shape has no servers)" in r.output
    assert r.output.rindex("the job finished") > r.output.index("chosen:")
