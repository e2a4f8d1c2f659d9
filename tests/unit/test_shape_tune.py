"""The shape search of ``kvhybrid-launch --tune`` on made-up step times: the grid, the
neighbours, the pruning model, failures, the remembered start; and the flags it refuses."""
import json
import sys

import pytest

from kvhybrid.launch import cli, shape_tune, tune
from kvhybrid.launch.shape_tune import Grid, Shape, ShapeSearch


def run_search(search, times, failing=()):
    """Drive ``search`` with ``times[shape]`` seconds per step (or a list: one per trial of
    the shape); the shapes tried, in order."""
    tried = []
    while (shape := search.next()) is not None:
        tried.append(shape)
        if shape in failing:
            search.fail(shape, "exit code 3")
        else:
            t = times[shape]
            search.record(shape, t.pop(0) if isinstance(t, list) else t)
    search.finish("no untried shape could win")
    return tried


def additive(grid, groups, servers):
    """Step times that are a part per group count plus a part per server setting."""
    return {s: groups[s.clients] + servers[s.server_setting] for s in grid.allowed()}


def test_the_grid_lists_every_shape_and_why_some_are_not_allowed():
    grid = Grid(4, 1)
    assert grid.allowed() == [Shape(1, 0), Shape(1, 1), Shape(1, 2), Shape(4, 1), Shape(4, 2)]
    assert grid.why_not(Shape(4, 0)) == "client groups talk through servers"
    two = Grid(4, 2)
    assert len(two.allowed()) == 9 and Shape(1, 2, "host") in two.allowed()
    assert Shape(1, 2, "host") in two.neighbours(Shape(1, 2))
    # a group per host becomes one group with either row masters
    assert {Shape(1, 2), Shape(1, 2, "host")} <= set(two.neighbours(Shape(2, 2)))
    assert Shape(1, 1, "host") not in Grid(4, 1).neighbours(Shape(4, 1))
    assert Grid(6, 4).why_not(Shape(4, 4)) == "6 workers do not split into 4 equal groups"
    with pytest.raises(ValueError, match="row_masters"):
        Shape(1, 1, "rank")


def test_the_extremes_come_first_and_the_remembered_shape_before_them():
    grid = Grid(4, 1)
    search = ShapeSearch(grid)
    assert search.next() == Shape(1, 0)
    search.record(Shape(1, 0), 0.05)
    assert search.next() == Shape(4, 1)
    again = ShapeSearch(grid, start=Shape(1, 2))
    assert again.next() == Shape(1, 2)


@pytest.mark.parametrize("best", [Shape(1, 0), Shape(1, 2), Shape(4, 2), Shape(1, 4, "host"),
                                  Shape(2, 2), Shape(4, 4)])
def test_the_search_finds_the_best_of_a_valley_in_at_most_six_trials(best):
    grid = Grid(4, 2)
    cl, sl = grid.client_levels, grid.server_levels

    def distance(s):   # a valley around ``best`` on the grid
        return (abs(cl.index(s.clients) - cl.index(best.clients))
                + abs(sl.index(s.servers) - sl.index(best.servers))
                + (s.row_masters != best.row_masters))
    times = {s: 0.05 + 0.01 * distance(s) for s in grid.allowed()}
    search = ShapeSearch(grid)
    tried = run_search(search, times)
    assert len(tried) <= shape_tune.MAX_TRIALS
    # each shape once, but the best perhaps twice (its trials agree: the margin stays)
    assert len(tried) - len(set(tried)) <= 1 and tried.count(best) >= len(tried) - len(set(tried))
    assert search.best() == best, shape_tune.format_table(search, search.best())
    assert search.noise == shape_tune.NOISE


def test_a_shape_the_model_says_is_slower_is_pruned_without_a_trial():
    grid = Grid(4, 1)
    # servers help, more groups cost more: one group with two servers wins, and (4, 2)
    # follows from the rectangle (1, 1), (1, 2), (4, 1)
    times = additive(grid, {1: 0.0, 4: 0.05}, {(0, "group"): 0.04, (1, "group"): 0.03,
                                                 (2, "group"): 0.02})
    search = ShapeSearch(grid)
    tried = run_search(search, times)
    assert search.best() == Shape(1, 2)
    assert Shape(4, 2) not in tried
    assert search.predict(Shape(4, 2)) == pytest.approx(times[Shape(4, 2)])
    assert search.outcomes[Shape(4, 2)].status == "pruned"
    assert "predicted 70.0 ms" in search.outcomes[Shape(4, 2)].reason


def test_a_dense_only_model_skips_one_group_with_servers():
    grid = Grid(4, 1)
    search = ShapeSearch(grid, dense_only=True)
    times = {s: 0.05 for s in grid.allowed()}
    times[Shape(1, 0)] = 0.03   # (far ahead: no repeat)
    tried = run_search(search, times)
    assert tried == [Shape(1, 0), Shape(4, 1)]
    assert search.outcomes[Shape(1, 1)].reason.startswith("dense-only model")
    assert search.outcomes[Shape(4, 2)].reason == \
        "not next to the best shape or one within 5% of it"


def test_a_failed_trial_is_skipped_and_the_search_goes_on():
    grid = Grid(4, 1)
    times = {s: 0.05 for s in grid.allowed()}
    search = ShapeSearch(grid)
    tried = run_search(search, times, failing={s for s in grid.allowed() if s.servers})
    assert tried[:2] == [Shape(1, 0), Shape(4, 1)] and search.best() == Shape(1, 0)
    assert search.outcomes[Shape(4, 1)].status == "failed"
    table = shape_tune.format_table(search, search.best())
    assert "| 2 | 4 groups, 1 server | – | failed: exit code 3 |" in table
    assert "not allowed: client groups talk through servers" in table


def test_a_trial_that_hangs_is_cut_off_at_its_timeout(tmp_path):
    result = shape_tune.run_trial([sys.executable, "-c", "import time; time.sleep(60)"], {},
                                  1.0, str(tmp_path / "trial.log"))
    assert result.rc is None
    assert shape_tune.failure_reason(result, 1.0).startswith("cut off after 1 s")
    killed = shape_tune.TrialResult(137, 1.0, [])
    assert "out of memory" in shape_tune.failure_reason(killed, 1.0)


def test_no_trial_starts_that_the_budget_cannot_fit(tmp_path):
    trials = shape_tune.Trials(lambda shape: [], shape_tune.Budget(100.0), str(tmp_path))
    assert trials.fits()    # the first trial: nothing to compare with
    trials.budget.started -= 60
    trials.walls.append(50.0)
    assert not trials.fits() and trials.timeout() == shape_tune.MIN_TRIAL_TIMEOUT
    with pytest.raises(ValueError, match="--tune-budget"):
        shape_tune.Budget(0)


def test_the_shape_cache_is_per_job_and_survives_a_bad_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("KVHYBRID_CACHE_DIR", str(tmp_path))
    a = shape_tune.signature(["python", "train.py"], 4, [("localhost", 4)], "local")
    b = shape_tune.signature(["python", "train.py"], 4, [("a", 2), ("b", 2)], "ssh")
    assert a != b and shape_tune.remembered(a) is None
    shape_tune.tune.remember(a, {"shape": {"clients": 1, "servers": 2, "row_masters": "group"}})
    shape_tune.tune.remember(b, {"shape": {"clients": 0}})
    assert shape_tune.remembered(a) == Shape(1, 2) and shape_tune.remembered(b) is None


@pytest.mark.parametrize("flags, says", [
    (["--tune", "--clients", "2"], "drop --clients"),
    (["--tune", "-s", "1"], "drop --servers"),
    (["--tune", "--auto", "--sparse"], "drop --auto, --sparse"),
    (["--tune", "--tune-partitions"], "drop --tune-partitions"),
    (["--tune", "--dry-run"], "--dry-run starts nothing"),
    (["--tune", "--servers", "1", "--restarts", "1"], "drop --servers"),
    (["--tune", "--restarts", "1"], "drop --restarts"),
    (["--tune-budget", "60"], "add --tune"),
    (["--tune", "--tune-budget", "-5"], "more than 0 seconds"),
])
def test_tune_refuses_flags_that_fix_the_shape_or_start_nothing(flags, says, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["-n", "2", *flags, "python", "examples/train_mlp.py"])
    assert exc.value.code == 2 and says in capsys.readouterr().err
    args = cli.parse_args(["-n", "2", "--tune", "python", "examples/train_mlp.py"])
    assert args.tune_budget == shape_tune.DEFAULT_BUDGET


class FakeTrials(shape_tune.Trials):
    """Trials that write made-up stats instead of starting jobs: P=2 is the fastest."""

    def __init__(self, tmp, budget=600.0, wall=1.0):
        super().__init__(lambda shape: [], shape_tune.Budget(budget), str(tmp))
        self.walls = [wall]
        self.envs = []

    def run(self, shape, env=None):
        self.envs.append(dict(env or {}))
        p = int(env["KVHYBRID_PARTITIONS"])
        stats = {"step_seconds": [1.0] * 3 + [0.01 + 0.002 * abs(p - 2)] * 5, "keys": {"4": {}}}
        with open(env["KVHYBRID_STATS_FILE"], "w") as f:
            json.dump(stats, f)
        return stats, "", 1.0


def test_the_picks_partition_count_is_searched_only_where_it_matters(tmp_path, monkeypatch):
    monkeypatch.setenv("KVHYBRID_CACHE_DIR", str(tmp_path / "cache"))
    sparse = ShapeSearch(Grid(4, 1), dense_only=False)
    trials = FakeTrials(tmp_path)
    note = shape_tune.search_partitions(Shape(4, 1), sparse, trials, 1, "sig", 3, None)
    assert note == "partitions: searched, P = 2"
    assert [e["KVHYBRID_PARTITIONS"] for e in trials.envs] == ["1", "2", "4"]
    assert shape_tune.tune.remembered("sig") == 2
    assert "no servers" in shape_tune.search_partitions(Shape(1, 0), sparse, trials, 1, "s", 3,
                                                        None)
    dense = ShapeSearch(Grid(4, 1), dense_only=True)
    assert "dense-only" in shape_tune.search_partitions(Shape(4, 1), dense, trials, 1, "s", 3,
                                                        None)
    short = FakeTrials(tmp_path, budget=100.0, wall=40.0)
    assert "the budget left fits 2 trials" in shape_tune.search_partitions(
        Shape(4, 1), sparse, short, 1, "s", 3, None)


# A stand-in for a long training job: it writes rank 0's stats as the store does once
# KVHYBRID_STATS_STEPS steps have begun, then trains on, and fails if it is let finish.
LONG_JOB = """
import json, os, sys, time
steps = int(os.environ["KVHYBRID_STATS_STEPS"])
time.sleep(0.5)
with open(os.environ["KVHYBRID_STATS_FILE"], "w") as f:
    json.dump({"step_seconds": [0.5] * 3 + [0.02] * (steps - 4), "steps": steps, "keys": {}}, f)
time.sleep(120)
sys.exit(3)
"""


def test_a_trial_stops_once_its_steps_are_in_however_long_the_job(tmp_path):
    trials = shape_tune.Trials(lambda shape: [sys.executable, "-c", LONG_JOB],
                               shape_tune.Budget(600.0), str(tmp_path))
    stats, reason, wall = trials.run(Shape(1, 0))
    assert reason == "" and stats["seconds"] == pytest.approx(0.02)
    assert stats["steps"] == shape_tune.tune.WARMUP_STEPS + shape_tune.TRIAL_STEPS + 1
    assert trials.walls == [wall]   # stopped there: a job let finish would fail


def test_a_job_shorter_than_a_trial_is_measured_from_its_end(tmp_path):
    short = ("import json, os\nwith open(os.environ['KVHYBRID_STATS_FILE'], 'w') as f:\n"
             "    json.dump({'step_seconds': [0.5] * 3 + [0.03] * 6, 'steps': 10}, f)\n")
    trials = shape_tune.Trials(lambda shape: [sys.executable, "-c", short],
                               shape_tune.Budget(600.0), str(tmp_path))
    stats, reason, _ = trials.run(Shape(1, 0))
    assert reason == "" and stats["seconds"] == pytest.approx(0.03)


def test_a_group_per_host_leads_on_to_one_group_with_rows_by_host():
    """Two knobs apart on the grid, yet the nearest shape in traffic: both sum rows per host."""
    grid = Grid(4, 2)
    times = {s: 0.030 for s in grid.allowed()}
    times.update({Shape(1, 0): 0.060, Shape(4, 2): 0.021, Shape(2, 2): 0.019,
                  Shape(1, 2, "host"): 0.017})
    search = ShapeSearch(grid)
    tried = run_search(search, times)
    assert Shape(1, 2, "host") in tried and search.best() == Shape(1, 2, "host")
    assert len(tried) <= shape_tune.MAX_TRIALS


def test_the_search_also_moves_from_shapes_within_the_noise_of_the_best():
    """A group per worker trials 3 % ahead of a group per host (as on 2 emulated hosts at
    1 Gbit/s, where trials swing more than that): the shapes next to the group per host are
    tried too, one group with rows by host among them, the fastest."""
    grid = Grid(4, 2)
    times = {s: 0.036 for s in grid.allowed()}
    times.update({Shape(1, 0): 0.100, Shape(4, 2): 0.0286, Shape(2, 2): 0.0296,
                  Shape(1, 2, "host"): 0.0282})
    search = ShapeSearch(grid)
    tried = run_search(search, times)
    assert search.contenders()[0] == Shape(1, 2, "host")
    assert Shape(1, 2, "host") in tried and search.best() == Shape(1, 2, "host")
    assert len(tried) <= shape_tune.MAX_TRIALS


def test_a_cache_folder_that_cannot_be_made_is_named_with_the_fix(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KVHYBRID_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(OSError, match=r"a-file/cache \(KVHYBRID_CACHE_DIR\), which failed: .*"
                                      r"set KVHYBRID_CACHE_DIR to a writable folder"):
        tune.trials_dir()


def test_a_repeat_of_the_best_that_disagrees_widens_the_margin_and_the_search_goes_on():
    """Pure MPI's first trial reads far faster than its whole jobs (as the Module example's do
    on 2 cores, job to job): its repeat shows the swing, and the shapes that margin no longer
    rules out are tried, the fastest of them among them; the pick names its equals."""
    grid = Grid(4, 1)
    times = {Shape(1, 0): [0.032, 0.043], Shape(4, 1): 0.048, Shape(1, 1): 0.044,
             Shape(1, 2): 0.041, Shape(4, 2): 0.035}
    search = ShapeSearch(grid)
    tried = run_search(search, times)
    assert tried[:4] == [Shape(1, 0), Shape(4, 1), Shape(1, 1), Shape(1, 0)]
    assert set(tried) == set(grid.allowed()) and len(tried) == shape_tune.MAX_TRIALS
    assert search.noise == pytest.approx(0.011 / 0.032)
    assert search.best() == Shape(4, 2)
    assert search.measured()[Shape(1, 0)] == pytest.approx(0.0375)
    assert set(search.equals(Shape(4, 2))) == {Shape(1, 0), Shape(1, 2), Shape(1, 1)}
    table = shape_tune.format_table(search, search.best())
    assert ("| 1, 4 | 1 group, 0 servers (pure MPI) | 37.50 | measured twice (the mean of "
            "32.00 and 43.00: 34% apart, the search's noise margin) |") in table


def test_the_best_is_repeated_only_when_another_shape_is_near_it():
    grid = Grid(4, 1)
    far = {s: 0.1 for s in grid.allowed()} | {Shape(1, 0): 0.05}
    assert Shape(1, 0) not in run_search(ShapeSearch(grid), far)[1:]
    near = {s: 0.1 for s in grid.allowed()} | {Shape(1, 0): 0.07}
    tried = run_search(ShapeSearch(grid), near)
    assert tried.count(Shape(1, 0)) == 2 and tried[-1] == Shape(1, 0)


def test_a_failed_repeat_keeps_the_first_trial():
    grid = Grid(4, 1)
    search = ShapeSearch(grid)
    search.record(Shape(1, 0), 0.04)
    search.record(Shape(4, 1), 0.05)
    search.fail(Shape(1, 0), "exit code 3")
    assert search.measured()[Shape(1, 0)] == 0.04 and search.trials == 3
    assert search.noise == shape_tune.NOISE and search.outcomes[Shape(1, 0)].repeat == 3
