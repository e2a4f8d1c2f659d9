"""The papers' page: claims judged from their figures, and Table 3's bytes for each
system's routing."""
import pytest

from experiments import papers, report_papers
from experiments.report_papers import Claim, routed_bytes

RESULT = {"dense_bytes": 1000.0, "table_bytes": [10_000.0]}


def test_table3_bytes_follow_each_systems_routing():
    # 2 hosts: 4(N-1)/N = 2 per byte; 2 workers per host
    assert routed_bytes("kvhybrid", RESULT, 0.01, 0.015) == pytest.approx(2 * (1000 + 150))
    assert routed_bytes("dist_sync", RESULT, 0.01, 0.015) == pytest.approx(2 * 2 * (1000 + 100))
    assert routed_bytes("kvhybrid all-PS", RESULT, 0.01, 0.015) == \
        routed_bytes("dist_sync", RESULT, 0.01, 0.015)
    assert routed_bytes("kvhybrid all-AR", RESULT, 0.01, 0.015) == pytest.approx(2 * 11_000)
    # Horovod's one ring over 4 ranks: 4(R-1)/R = 3 per byte on each host's link
    assert routed_bytes("Horovod", RESULT, 0.01, 0.015) == pytest.approx(3 * 11_000)


def test_a_hosts_alpha_is_at_least_its_workers():
    worker, host = report_papers.alphas("lm", 50, 32, range(2, 6))
    assert 0 < worker <= host <= 2 * worker


@pytest.mark.parametrize("ours, verdict", [
    ({"100mbit": ("x", True), "1gbit": ("y", True)}, "reproduced"),
    ({"100mbit": ("x", True), "1gbit": ("y", False)}, "reproduced at 100mbit"),
    ({"100mbit": ("x", False), "1gbit": ("y", True)}, "not reproduced"),
    ({"1gbit": ("y", True)}, "not measured"),
])
def test_the_verdict_is_the_first_rates(ours, verdict):
    assert Claim("paper", "target", ours=ours).verdict(["100mbit", "1gbit"]) == verdict


def test_without_root_only_the_page_can_be_written(monkeypatch, capsys):
    monkeypatch.setattr(papers.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit):
        papers.parse_args([])
    assert "run as root, or write the page from measured results with --page-only" in \
        capsys.readouterr().err
    assert papers.parse_args(["--page-only"]).page_only


def test_an_empty_folder_gives_a_page_that_says_nothing_is_measured(tmp_path):
    report_papers.write_page(tmp_path, ["100mbit"])
    page = (tmp_path / "papers.md").read_text()
    assert page.count("| not measured |") >= 6 and "Measured: " in page


def test_the_readme_list_is_rewritten_between_its_markers_only():
    claims = [Claim("paper", "target", "a claim", {"100mbit": ("1.5×", True)})]
    readme = f"intro\n{report_papers.BEGIN}\nold\n{report_papers.END}\nrest\n"
    got = report_papers.replace_claims(readme, claims, ["100mbit"])
    assert got.startswith("intro\n") and got.endswith(f"{report_papers.END}\nrest\n")
    assert "| a claim | reproduced | 1.5× |" in got and "old" not in got
    with pytest.raises(ValueError, match="needs the papers' markers once each"):
        report_papers.replace_claims("no markers", claims, ["100mbit"])


def test_the_readme_holds_the_markers_once():
    readme = (report_papers.ROOT / "README.md").read_text()
    assert readme.count(report_papers.BEGIN) == 1 and readme.count(report_papers.END) == 1


def test_cpu_ratios_pair_the_systems_of_one_round(tmp_path):
    import json

    def run(caller, machine):
        return {"cpu_ms_per_step": {"caller": caller}, "machine_cpu_ms_per_step": machine}
    rounds = [{"lm": {"kvhybrid": run(2.0, 30.0), "dist_sync": run(1.0, 20.0)}},
              {"lm": {"kvhybrid": run(3.0, 20.0), "dist_sync": run(2.0, 20.0)}}]
    (tmp_path / "models_100mbit_rounds.json").write_text(json.dumps({"rounds": rounds}))
    (rate, model, caller, machine), = report_papers.cpu_ratios(tmp_path, ["100mbit"])
    assert (rate, model, caller, machine) == ("100mbit", "lm", [2.0, 1.5], [1.5, 1.0])
