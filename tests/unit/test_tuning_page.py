"""benchmarks.tuning's page from made-up results: the pick against the sweep's best, the
tuning's time against the sweep's, and the provenance every page ends with."""
import argparse

from benchmarks import tuning


def fake_result():
    sweep = {"1 group, 0 servers (pure MPI)": {"shape": {"clients": 1, "servers": 0,
                                                         "row_masters": "group"},
                                               "ms_per_step": 20.0, "seconds": 10.0},
             "4 groups, 1 server": {"shape": {"clients": 4, "servers": 1, "row_masters": "group"},
                                    "ms_per_step": 16.0, "seconds": 12.0}}
    tune = {"shape": {"clients": 1, "servers": 0, "row_masters": "group"}, "seconds": 11.0,
            "shape_seconds": 5.5,
            "trials": [{"shape": sweep[k]["shape"], "trial": i + 1} for i, k in enumerate(sweep)],
            "table": "shape tuning: ...", "partition_search": "dense-only model\npartitions: -"}
    r = {"sweep": sweep, "tune": tune}
    r["summary"] = tuning.summarize(r)
    return r


def test_the_page_compares_the_pick_with_the_sweeps_best(tmp_path):
    r = fake_result()
    assert r["summary"]["best"] == "4 groups, 1 server"
    assert r["summary"]["ratio"] == 16.0 / 20.0 and r["summary"]["time_ratio"] == 0.5
    args = argparse.Namespace(hosts=0, rate="1gbit", workers=4, delay=None, steps=30,
                              tokens=50, budget=600.0, rounds=1)
    page = tuning.report({"lm": r}, args)
    assert "| lm | 1 group, 0 servers (pure MPI) | 4 groups, 1 server | **0.800** | 2 | " \
           "0.25 (6 s ÷ 22 s) | 0.50 (11 s) |" in page
    assert "Command: `python -m benchmarks.tuning" in page and "Measured: " in page
    tuning.plot({"lm": r}, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5_000
