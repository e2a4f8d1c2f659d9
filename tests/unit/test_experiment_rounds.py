"""How the experiment runner folds several rounds of a mode into one row: the median round's
curve, each figure's median and range, and ratios taken round by round."""
import pytest

from experiments import report


def run(round_, epoch_seconds, accuracies):
    """A mode's run whose rank 0 validated after every epoch of ``epoch_seconds``."""
    validation = [{"epoch": e + 1, "train_seconds": epoch_seconds * (e + 1), "accuracy": a,
                   "loss": 1.0, "perplexity": 2.7} for e, a in enumerate(accuracies)]
    return {"validation": validation, "mean_epoch_seconds": epoch_seconds, "round": round_,
            "workers": 4, "steps_per_epoch": 10, "epoch_seconds": [[epoch_seconds]]}


def test_the_median_round_is_kept_and_every_round_summarised():
    rounds = [run(0, 3.0, [0.5, 0.9]), run(1, 1.0, [0.9, 0.9]), run(2, 2.0, [0.5, 0.7])]
    got = report.combine(rounds, target=0.8)
    assert got["mean_epoch_seconds"] == 2.0 and got["round"] == 2
    assert [r["target_seconds"] for r in got["rounds"]] == [6.0, 1.0, None]
    table = report.table("t", {"m": got}, {"m": "4 × 2"}, 0.8, perplexity=False)
    # time to target over the rounds that reached it, and how many did
    assert "| m | 4 × 2 | 2.000 (1.000–3.000) | 0.7000 | 3.5 (1.0–6.0), 2 of 3 rounds | - |" \
        in table
    assert report.time_to_target(got, 0.8) == 6.0     # median with the miss counted as never


def test_a_target_most_rounds_missed_counts_as_not_reached():
    got = report.combine([run(0, 1.0, [0.9]), run(1, 1.0, [0.5]), run(2, 1.0, [0.5])], 0.8)
    assert report.time_to_target(got, 0.8) is None


def test_speed_ratios_pair_the_runs_of_one_round():
    dist = report.combine([run(0, 4.0, [0.9]), run(1, 2.0, [0.9]), run(2, 9.0, [0.9])], 0.8)
    mpi = report.combine([run(0, 2.0, [0.9]), run(1, 2.0, [0.9]), run(2, 3.0, [0.9])], 0.8)
    assert report.round_ratios(dist, mpi) == [2.0, 1.0, 3.0]
    (answer,) = [a for a in report.findings("t", {"dist-SGD": dist, "mpi-SGD": mpi}, 0.8)
                 if "mean epoch" in a]
    assert "mpi-SGD is faster (2.00 (1.00–3.00)x dist-SGD's speed, the rounds' median" in answer


def test_one_round_reads_as_before():
    got = report.combine([run(0, 2.0, [0.5, 0.9])], 0.8)
    table = report.table("t", {"m": got}, {"m": "4 × 2"}, 0.8, perplexity=False)
    assert "| m | 4 × 2 | 2.000 | 0.9000 | 4.0 | 2 |" in table


@pytest.mark.parametrize("rounds", ["0", "-1"])
def test_rounds_below_one_are_refused(rounds, capsys):
    from experiments.__main__ import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--rounds", rounds])
    assert "--rounds must be at least 1" in capsys.readouterr().err
