"""The models suite's verdicts (no jobs run): ratios are paired round by round, the
median decides met or missed, and "the better peer" is the faster one in each round."""
from benchmarks.models import Setting, cost_table, miss_profiles, targets_table


def run(words_per_second: float, loss: float = 1.0) -> dict:
    return {"words_per_second": words_per_second, "loss": loss, "step_seconds": 1.0}


def rounds(*per_round):
    """per_round: {model: {system: words/s}} per round."""
    return [{m: {n: run(w) for n, w in systems.items()} for m, systems in r.items()}
            for r in per_round]


def row(table: str, what: str) -> str:
    lines = [line for line in table.splitlines() if line.startswith(f"| {what} |")]
    assert len(lines) == 1, (what, table)
    return lines[0]


def test_loopback_ratios_are_paired_per_round_and_the_median_decides():
    loop = Setting("loopback", 0, 1, rounds(
        {"lm": {"kvhybrid": 90, "dist_sync": 100, "Horovod": 10}},
        {"lm": {"kvhybrid": 120, "dist_sync": 100, "Horovod": 10}},
        {"lm": {"kvhybrid": 105, "dist_sync": 100, "Horovod": 10}}))
    table = targets_table([loop], workers=4)
    assert row(table, "loopback: lm kvhybrid ÷ dist_sync") == \
        "| loopback: lm kvhybrid ÷ dist_sync | 1.05× (0.90–1.20) | ≥ 1.00× | met |"
    # the better peer is dist_sync in every round here: the same ratios, a lower target
    assert "1.05× (0.90–1.20) | ≥ 0.95× | met" in row(table, "loopback: lm kvhybrid ÷ the better peer")


def test_the_better_peer_is_chosen_in_each_round_and_a_low_median_is_missed():
    net = Setting("2 emulated hosts × 2 workers at 100mbit", 2, 2, rounds(
        {"nmt": {"kvhybrid": 100, "dist_sync": 50, "Horovod": 125}},   # Horovod faster: 0.8
        {"nmt": {"kvhybrid": 100, "dist_sync": 80, "Horovod": 40}},    # dist_sync: 1.25
        {"nmt": {"kvhybrid": 100, "dist_sync": 110, "Horovod": 20}}))  # dist_sync: 0.91
    table = targets_table([net], workers=4)
    assert row(table, f"{net.where}: nmt kvhybrid ÷ the better peer") == \
        f"| {net.where}: nmt kvhybrid ÷ the better peer | 0.91× (0.80–1.25) | ≥ 1.00× | **missed** |"


def test_four_hosts_get_the_network_targets_and_not_the_two_host_ones():
    net = Setting("4 emulated hosts × 1 workers at 1gbit", 4, 4, rounds(
        {"lm": {"kvhybrid": 300, "dist_sync": 100, "Horovod": 50}}))
    table = targets_table([net], workers=4)
    assert "| 3.00× (3.00–3.00) | ≥ 2.00× | met" in row(table, f"{net.where}: lm kvhybrid ÷ dist_sync")
    assert "| 6.00× (6.00–6.00) | ≥ 4.00× | met" in row(table, f"{net.where}: lm kvhybrid ÷ Horovod")
    assert "better peer" not in table   # a target of the 2 × 2 shape and of loopback only


def test_every_miss_gets_a_profile_with_the_bound_and_the_step_the_target_asks_for():
    loop = Setting("loopback", 0, 1, rounds(
        {"lm": {"kvhybrid": 80, "dist_sync": 100, "compute only": 200}}))
    loop.sweeps = rounds({"10": {"kvhybrid": 50, "dist_sync": 100}})
    for r in loop.rounds + loop.sweeps:   # step times that match the throughputs
        for runs in r.values():
            for x in runs.values():
                x["step_seconds"] = 1.0 / x["words_per_second"]
    misses = []
    table = targets_table([loop], workers=4, misses=misses)
    assert "**missed**" in row(table, "loopback: lm kvhybrid ÷ dist_sync")
    assert "**missed**" in row(table, "loopback: lm at 10 words per sample, kvhybrid ÷ dist_sync")
    text = miss_profiles(misses, loop)
    assert "### loopback: lm, kvhybrid ÷ dist_sync ≥ 1.00×" in text
    assert "### loopback: lm at 10 words per sample, kvhybrid ÷ dist_sync ≥ 0.95×" in text
    # dist_sync's step is 10 ms: the target asks for 10 ms; alone, the processes take 5 ms
    assert "at most 10.0 ms" in text and "take 5.0 ms a step" in text
    assert "| compute only (loopback) | 5.0 |" in text


def test_with_an_even_number_of_rounds_the_verdict_uses_the_median_it_prints():
    loop = Setting("loopback", 0, 1, rounds(
        {"lm": {"kvhybrid": 90, "dist_sync": 100}}, {"lm": {"kvhybrid": 120, "dist_sync": 100}}))
    assert row(targets_table([loop], workers=4), "loopback: lm kvhybrid ÷ dist_sync") == \
        "| loopback: lm kvhybrid ÷ dist_sync | 1.05× (0.90–1.20) | ≥ 1.00× | met |"


def test_a_resumed_suite_reads_back_the_settings_it_wrote(tmp_path):
    """--resume keeps a setting from its NAME_rounds.json, written with or without the
    setting's name (files of earlier runs carry only the rounds): same verdicts."""
    import json
    from benchmarks.cluster import setting_name
    from benchmarks.models import load_setting
    net = Setting(setting_name(2, "100mbit", 4), 2, 2, rounds(
        {"lm": {"kvhybrid": 150, "dist_sync": 100, "Horovod": 10}}))
    assert net.where == "2 emulated hosts × 2 workers at 100mbit"
    for saved in ({"where": net.where, "servers": 2, "rounds": net.rounds, "sweeps": []},
                  {"rounds": net.rounds, "sweeps": []}):
        path = tmp_path / "models_2x2_100mbit_rounds.json"
        path.write_text(json.dumps(saved))
        kept = load_setting(path, hosts=2, rate="100mbit", servers=2, workers=4)
        assert (kept.where, kept.hosts, kept.servers, kept.rate) == (net.where, 2, 2, "100mbit")
        assert targets_table([kept], workers=4) == targets_table([net], workers=4)
    path.write_text(json.dumps({"rounds": net.rounds, "steps": 20, "warmup": 5}))
    kept = load_setting(path, hosts=2, rate="100mbit", servers=2, workers=4)
    assert (kept.steps, kept.warmup) == (20, 5), "a setting's own step count is kept"


def test_targets_only_writes_the_verdicts_of_the_settings_measured_and_names_the_rest(tmp_path):
    import json
    from benchmarks.models import main
    net = rounds({"lm": {"kvhybrid": 90, "dist_sync": 100, "Horovod": 10}},
                 {"lm": {"kvhybrid": 160, "dist_sync": 100, "Horovod": 10}},
                 {"lm": {"kvhybrid": 150, "dist_sync": 100, "Horovod": 10}})
    for r in net:
        for x in r["lm"].values():
            x["table3_per_host"] = 0.6
    (tmp_path / "models_2x2_100mbit_rounds.json").write_text(json.dumps(
        {"rounds": net, "sweeps": [], "command": ["--suite", "--models", "lm"]}))
    main(["--suite", "--targets-only", "--models", "lm", "--out", str(tmp_path)])
    text = (tmp_path / "models_targets.md").read_text()
    assert "**Not measured yet:** loopback, 4 emulated hosts at 1gbit, 2 emulated hosts × 2 " \
           "workers at 1gbit (`--suite --resume` measures them)" in text
    where = "2 emulated hosts × 2 workers at 100mbit"
    assert row(text, f"{where}: lm kvhybrid ÷ dist_sync") == \
        f"| {where}: lm kvhybrid ÷ dist_sync | 1.50× (0.90–1.60) | ≥ 1.50× | met |"
    # the kept setting's tables name the run that measured it
    assert "Command: `python -m benchmarks.models --suite --models lm`" in \
        (tmp_path / "models_2x2_100mbit.md").read_text()


def test_before_after_pairs_each_round_and_reads_faster_as_above_one():
    # before_after's ratio is after's throughput ÷ before's: a shorter step after reads > 1
    from argparse import Namespace
    from benchmarks.before_after import _table
    steps = [(0.050, 0.040), (0.050, 0.050), (0.060, 0.050)]   # (before, after) per round
    rounds_ = [{"before": {"lm": {"kvhybrid": {"step_seconds": b}}},
                "after": {"lm": {"kvhybrid": {"step_seconds": a}}}} for b, a in steps]
    table = _table(rounds_, Namespace(models=["lm"], systems=["kvhybrid"]))
    assert row(table, "lm") == "| lm | kvhybrid | 50.0 | 50.0 | 1.20× (1.00–1.25) | – | – |"
    # with the caller's thread CPU measured: its median before and after, after ÷ before
    cpus = [(2.0, 1.0), (2.0, 1.5), (4.0, 2.0)]
    for r, (b, a) in zip(rounds_, cpus):
        r["before"]["lm"]["kvhybrid"]["cpu_ms_per_step"] = {"caller": b}
        r["after"]["lm"]["kvhybrid"]["cpu_ms_per_step"] = {"caller": a}
    table = _table(rounds_, Namespace(models=["lm"], systems=["kvhybrid"]))
    assert row(table, "lm").endswith("| 2.00 → 1.50 | 0.50× (0.50–0.75) |")


def test_before_after_refuses_a_tree_whose_jobs_would_run_other_code(tmp_path):
    # a tree without its own kvhybrid: a job started there imports the installed one, and
    # would compare a commit with itself
    from pathlib import Path

    import pytest
    from benchmarks import ROOT
    from benchmarks.before_after import check_imports
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    with pytest.raises(SystemExit, match="not the tree's own code"):
        check_imports(tmp_path)
    check_imports(Path(ROOT))   # the repository's jobs run the repository's code


def test_a_missed_targets_profile_says_where_the_machines_cpu_went():
    """Each role's CPU a step, the workers' whole, the rest of the machine (the servers),
    and the machine's CPU ÷ its cores: the least a CPU-bound step can take."""
    import os
    from benchmarks.models import cpu_roles_row
    r = {"workers": 4, "machine_cpu_ms_per_step": 24.0,
         "cpu_ms_per_step": {"caller": 2.5, "communication": 1.0, "native": 1.5, "other": 0.0}}
    cores = os.cpu_count()
    assert cpu_roles_row("kvhybrid", r) == \
        f"| kvhybrid | 2.5 | 1.0 | 1.5 | 20.0 | 4.0 | 24.0 | {24.0 / cores:.1f} |"
    # a run without the readings (an older JSON) keeps the table's shape
    assert cpu_roles_row("dist_sync", {"workers": 4}) == "| dist_sync |" + " |" * 7


def test_the_cost_table_pairs_each_rounds_cpu_with_dist_syncs():
    def cpu_run(words, caller, machine):
        return dict(run(words), cpu_ms_per_step={"caller": caller}, machine_cpu_ms_per_step=machine)

    loop = Setting("loopback", 0, 1, [
        {"lm": {"kvhybrid": cpu_run(110, 2.0, 20), "dist_sync": cpu_run(100, 2.0, 25),
                "Horovod": cpu_run(10, 9.0, 90)}},
        {"lm": {"kvhybrid": cpu_run(100, 3.0, 30), "dist_sync": cpu_run(100, 2.0, 20),
                "Horovod": cpu_run(10, 9.0, 90)}},
        {"lm": {"kvhybrid": cpu_run(90, 1.0, 10), "dist_sync": cpu_run(100, 2.0, 40),
                "Horovod": cpu_run(10, 9.0, 90)}}])
    table = cost_table(loop)
    # each round's own ratio, then the median: the caller's 1.0, 1.5, 0.5; the machine's
    # 0.8, 1.5, 0.25 (medians of the rounds' figures alone would read 1.0 and 1.0)
    assert row(table, "lm") == "| lm | kvhybrid | 1.00× (0.90–1.10) | 1.00× (0.50–1.50) | " \
        "0.80× (0.25–1.50) |"
    assert "Horovod" not in table and "| lm | dist_sync" not in table
    # no CPU recorded (older pages): no table
    assert cost_table(Setting("loopback", 0, 1, rounds({"lm": {"kvhybrid": 1, "dist_sync": 1}}))) == ""
