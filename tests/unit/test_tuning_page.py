"""benchmarks.tuning's page from made-up results: each round's pick against the sweep's
best, the tuning's time against a sweep's, the job length at which the tuning is 15 % of a
sweep, and the provenance every page ends with."""
import argparse
import json

import pytest

from benchmarks import tuning

MPI = {"clients": 1, "servers": 0, "row_masters": "group"}
PS = {"clients": 4, "servers": 1, "row_masters": "group"}


def fake_result():
    # 10 steps a job (5 + 5): pure MPI 20 ms a step and 4 s of start-up, all-PS 16 ms and 5 s
    sweep = {"1 group, 0 servers (pure MPI)": {"shape": MPI, "rounds_ms": [19.0, 20.0, 21.0],
                                               "job_seconds": [4.2] * 3, "ms_per_step": 20.0},
             "4 groups, 1 server": {"shape": PS, "rounds_ms": [16.0, 15.0, 17.0],
                                    "job_seconds": [5.16] * 3, "ms_per_step": 16.0}}
    trials = [{"shape": MPI, "trial": 1}, {"shape": PS, "trial": 2}]
    tunes = [{"shape": shape, "seconds": seconds, "shape_seconds": seconds / 2,
              "trials": trials, "table": "shape tuning: ...",
              "partition_search": "dense-only model\npartitions: -"}
             for shape, seconds in ((MPI, 9.36), (PS, 4.68), (PS, 4.68))]
    r = {"sweep": sweep, "sweep_seconds": [9.36] * 3, "tunes": tunes, "steps": 5, "warmup": 5}
    r["summary"] = tuning.summarize(r)
    return r


def test_the_page_compares_each_pick_with_the_sweeps_best(tmp_path):
    r = fake_result()
    s = r["summary"]
    assert s["best"] == "4 groups, 1 server" and s["picks"][0] == "1 group, 0 servers (pure MPI)"
    assert s["ratio"] == {"median": 1.0, "min": 0.8, "max": 1.0}
    assert s["time_ratio"]["median"] == 0.5 and s["time_ratio"]["max"] == 1.0
    # 4.68 s of tuning is 15 % of a 31.2 s sweep: 9 s of start-up + 36 ms a step of both
    assert s["long_enough"] == pytest.approx(617, abs=1)
    args = argparse.Namespace(hosts=0, rate="1gbit", workers=4, delay=None, steps=5, warmup=5,
                              tokens=50, budget=600.0, rounds=3)
    settings = tuning.with_setting(tmp_path / "none.json", tuning.setting({"lm": r}, args))
    page = tuning.report(settings)
    assert "| loopback | lm | 4 groups, 1 server | 1 group, 0 servers (pure MPI); 4 groups, " \
           "1 server; 4 groups, 1 server | **1.000 (0.800–1.000)** | 2 (2) | 0.25 (0.25–0.50) " \
           "| 0.50 (0.50–1.00) (sweep 9 s) | 617 steps |" in page
    assert "| 4 groups, 1 server (best) ← picked | 16.00 | 16.0, 15.0, 17.0 | 1.000 | 5.2 |" \
        in page
    assert "### lm: `--tune`, round 3 (its own table)" in page
    assert "\nCommand: `python -m benchmarks.tuning" in page and "\nMeasured: " in page
    tuning.plot(settings, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5_000


def test_a_run_replaces_its_own_models_of_its_setting_and_keeps_the_rest(tmp_path):
    loopback = argparse.Namespace(hosts=0, rate="1gbit", workers=4, delay=None, steps=5,
                                  warmup=5, tokens=50, budget=600.0, rounds=3)
    hosts = argparse.Namespace(**{**vars(loopback), "hosts": 2, "rate": "100mbit"})
    page = tmp_path / "tuning.json"
    page.write_text(json.dumps({"settings": tuning.with_setting(
        page, tuning.setting({"lm": fake_result(), "nmt": fake_result()}, loopback))}))
    page.write_text(json.dumps({"settings": tuning.with_setting(
        page, tuning.setting({"lm": fake_result()}, hosts))}))
    later = argparse.Namespace(**{**vars(loopback), "steps": 7})
    again = tuning.with_setting(page, tuning.setting({"cnn": fake_result(),
                                                      "lm": fake_result()}, later))
    assert list(again) == ["loopback", "2 emulated hosts × 2 workers at 100mbit"]
    assert list(again["loopback"]["models"]) == ["lm", "nmt", "cnn"]
    assert list(again["2 emulated hosts × 2 workers at 100mbit"]["models"]) == ["lm"]
    loop = again["loopback"]["models"]
    assert "5 + 7 steps" in loop["lm"]["about"] and "5 + 7 steps" in loop["cnn"]["about"]
    assert "5 + 5 steps" in loop["nmt"]["about"]   # (as it was measured)
    text = tuning.report(again)
    assert "| 2 emulated hosts × 2 workers at 100mbit | lm |" in text
    assert text.count("\nCommand: ") == 4 and text.count("\nMeasured: ") == 4


def test_a_page_that_kept_its_provenance_per_setting_keeps_it_per_model(tmp_path):
    page = tmp_path / "tuning.json"
    page.write_text(json.dumps({"settings": {"loopback": {
        "where": "loopback", "about": "4 workers, then", "command": "Command: `x`",
        "measured": "Measured: then", "models": {"nmt": fake_result(),
                                                 "cnn": fake_result()}}}}))
    args = argparse.Namespace(hosts=0, rate="1gbit", workers=4, delay=None, steps=5, warmup=5,
                              tokens=50, budget=600.0, rounds=3)
    settings = tuning.with_setting(page, tuning.setting({"lm": fake_result()}, args))
    for model in ("nmt", "cnn"):
        r = settings["loopback"]["models"][model]
        assert (r["about"], r["command"], r["measured"]) == \
            ("4 workers, then", "Command: `x`", "Measured: then"), model
    assert tuning.report(settings).count("Measured: then") == 2


def test_no_job_length_is_claimed_when_a_shape_failed_in_the_sweep():
    r = fake_result()
    r["sweep"]["4 groups, 1 server"].update(rounds_ms=[16.0, None, 17.0], ms_per_step=None)
    assert tuning.long_enough(r) is None


def test_the_module_workload_runs_the_example_for_at_least_the_steps_asked():
    args = argparse.Namespace(steps=200, warmup=5, tokens=50)
    cmd = tuning.worker_command(args, "module", "/tmp/out")
    assert cmd[:2] == ["python", str(tuning.MODULE_EXAMPLE)] and tuning.MODULE_EXAMPLE.exists()
    epochs, batches = int(cmd[cmd.index("--epochs") + 1]), int(cmd[cmd.index("--batches") + 1])
    assert epochs * batches >= 205 > (epochs - 1) * batches
    assert cmd[cmd.index("--optimizer") + 1] == "adam"
