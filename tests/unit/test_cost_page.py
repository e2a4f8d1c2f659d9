"""benchmarks/cost.py's arithmetic (no jobs run): each ratio is to dist_sync's figure of
the same round, the communication's CPU is the machine's less compute only's of that
round, and the README's status row takes the cost page's own ratios."""
import json

from benchmarks import cost, status
from benchmarks.common import ratio_cell


def run(ms, caller, machine):
    return {"step_seconds": ms / 1e3, "cpu_ms_per_step": {"caller": caller},
            "machine_cpu_ms_per_step": machine}


ROUNDS = [{"lm": {"kvhybrid": run(10, 4.0, 30.0), "dist_sync": run(8, 2.0, 25.0),
                  "compute only": run(5, 3.0, 20.0)}},
          {"lm": {"kvhybrid": run(12, 6.0, 36.0), "dist_sync": run(9, 3.0, 24.0),
                  "compute only": run(6, 3.0, 21.0)}},
          {"lm": {"kvhybrid": run(9, 3.0, 33.0), "dist_sync": run(10, 2.0, 26.0),
                  "compute only": run(5, 3.0, 20.0)}}]


def test_ratios_are_to_the_same_rounds_dist_sync():
    assert cost.ratios(ROUNDS, "lm", "kvhybrid", cost._caller) == [2.0, 2.0, 1.5]
    # communication: (30-20)/(25-20), (36-21)/(24-21), (33-20)/(26-20)
    assert cost.ratios(ROUNDS, "lm", "kvhybrid", cost._communication) == [2.0, 5.0, 13 / 6]


def test_no_ratio_to_a_communication_within_the_noise():
    quiet = [{"lm": {"kvhybrid": run(10, 4.0, 30.0), "dist_sync": run(8, 2.0, 20.5),
                     "compute only": run(5, 3.0, 20.0)}}]   # dist_sync's: 0.5 of 20.5 ms
    assert cost.ratios(quiet, "lm", "kvhybrid", cost._communication) == []
    assert cost.cell(quiet, "lm", "kvhybrid", cost._communication) == "10.0"
    # a system's communication below zero: compute only's noise, no ratio either
    below = [{"lm": {"kvhybrid": run(10, 4.0, 18.0), "dist_sync": run(8, 2.0, 26.0),
                     "compute only": run(5, 3.0, 20.0)}}]
    assert cost.ratios(below, "lm", "kvhybrid", cost._communication) == []
    assert cost.ratios(below, "lm", "kvhybrid", cost._machine) == [18.0 / 26.0]


def test_a_cell_shows_the_median_rounds_figure_and_the_ratios():
    # the rounds' caller CPU: 4, 6, 3: the median round is the first
    assert cost.cell(ROUNDS, "lm", "kvhybrid", cost._machine) == \
        "30.0 · " + ratio_cell([30 / 25, 36 / 24, 33 / 26])
    assert cost.cell(ROUNDS, "lm", "dist_sync", cost._caller) == "2.0"   # the peer: no ratio
    table = cost.table({"2": ROUNDS}, ["lm"], cost.DEFAULT_SYSTEMS)
    assert table.count("| lm | 2 |") == 3   # kvhybrid all-PS did not run: no row


def test_the_status_row_is_the_cost_pages_caller_cpu_at_most_workers(tmp_path):
    saved = {"workers": {"1": ROUNDS[:1], "4": ROUNDS},
             "caller_cpu_ratio": cost.summary({"1": ROUNDS[:1], "4": ROUNDS}, ["lm"]),
             "measured": "Measured: 2026-01-02 03:04 UTC, commit abc1234, on 2 cores (Linux, "
                         "host h)."}
    assert saved["caller_cpu_ratio"] == {"lm": [2.0, 2.0, 1.5]}
    (tmp_path / "cost.json").write_text(json.dumps(saved))
    (only,) = status.load(tmp_path)
    row = status.table([only]).splitlines()[-1]
    assert row.startswith("| `dist_sync` (caller's thread CPU per step: lower is better) | "
                          "loopback, 4 workers, 2 cores | 2.00× (1.50–2.00) | – | – | 3 |"), row


def test_the_machine_cpu_row_follows_the_caller_cpu_row(tmp_path):
    workers = {"4": ROUNDS}
    saved = {"workers": workers, "caller_cpu_ratio": cost.summary(workers, ["lm"]),
             "machine_cpu_ratio": cost.summary(workers, ["lm"], metric=cost._machine),
             "measured": "Measured: 2026-01-02 03:04 UTC, commit abc1234, on 2 cores (Linux, "
                         "host h)."}
    assert saved["machine_cpu_ratio"] == {"lm": [30 / 25, 36 / 24, 33 / 26]}
    (tmp_path / "cost.json").write_text(json.dumps(saved))
    (only,) = status.load(tmp_path)
    caller, machine = status.table([only]).splitlines()[-2:]
    assert caller.startswith("| `dist_sync` (caller's thread CPU per step")
    assert machine.startswith("| `dist_sync` (machine CPU per step: lower is better) | "
                              "loopback, 4 workers, 2 cores | 1.27× (1.20–1.50) | – | – | 3 |"), \
        machine
