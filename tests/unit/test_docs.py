"""The docs a user reads: results that say when and how they were measured, a README whose
status table is the results', links that lead somewhere, and no internal work-step names."""
import re
from pathlib import Path

import pytest

from benchmarks import status

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks"
#: a work step's name ("stop" and a number, or a range of them), as the docs must never say it
WORK_STEP = re.compile(r"stop ?\d|\bstops? \d+ ?(to|and|-) ?\d+", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def markdown_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_results_folder_holds_one_current_result_per_benchmark():
    files = sorted(p.name for p in RESULTS.iterdir())
    assert len(files) <= 44, files   # (14 benchmarks: a page, its JSON, a plot each)
    assert all(p.is_file() for p in RESULTS.iterdir()), "no folders (patches, old runs) in it"


def test_every_result_page_names_its_command_date_commit_and_machine():
    for page in sorted(RESULTS.glob("*.md")):
        if page.name == "README.md":
            continue
        text = page.read_text()
        assert re.search(r"^Command: `python -m (benchmarks\.\w+|experiments)", text,
                         re.MULTILINE), f"{page.name} does not name its command"
        assert re.search(r"^Measured: \d{4}-\d\d-\d\d.*, commit \w+.*, on \d+ cores", text,
                         re.MULTILINE), f"{page.name} does not say when, on what code and machine"


@pytest.mark.parametrize("where", ["README.md", "docs", "benchmarks", "tests", "experiments"])
def test_no_work_step_names_in_the_product(where):
    path = ROOT / where
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()
                                             and "__pycache__" not in p.parts]
    named = [str(p.relative_to(ROOT)) for p in files if WORK_STEP.search(p.name)]
    said = [str(p.relative_to(ROOT)) for p in files
            if p.suffix in (".md", ".py", ".json") and WORK_STEP.search(p.read_text())]
    assert not named and not said, named + said


def test_every_relative_link_in_the_docs_leads_to_a_file():
    broken = []
    for page in markdown_files():
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_status_table_is_what_the_results_say():
    readme = (ROOT / "README.md").read_text()
    settings = status.load(RESULTS)
    assert settings, "no models results to draw the status table from"
    assert status.replace_block(readme, status.block(settings)) == readme, \
        "README's status table differs from docs/benchmarks: run python -m benchmarks.status"
    assert (RESULTS / status.PLOT).exists()


def test_the_status_table_takes_the_models_pages_own_ratios(tmp_path):
    """A rounds file gives the same median and range as the models benchmark's table
    (``common.ratio_cell`` over ``Setting.ratios``)."""
    import json
    from benchmarks.common import ratio_cell

    def run(words):
        return {"words_per_second": words}

    rounds = [{"lm": {"kvhybrid": run(110), "dist_sync": run(100)}},
              {"lm": {"kvhybrid": run(90), "dist_sync": run(100)}},
              {"lm": {"kvhybrid": run(130), "dist_sync": run(100)}}]
    (tmp_path / "models_rounds.json").write_text(json.dumps(
        {"rounds": rounds, "measured": "Measured: 2026-01-02 03:04 UTC, commit abc1234, on 2 "
                                       "cores (Linux, host h)."}))
    (only,) = status.load(tmp_path)
    assert status.cell(only.ratios["dist_sync"]["lm"]) == ratio_cell([1.1, 0.9, 1.3]) \
        == "1.10× (0.90–1.30)"
    assert (only.cores, only.when) == ("2 cores", "2026-01-02, abc1234")
    row = status.table([only]).splitlines()[-1]
    assert row.startswith("| `dist_sync` (throughput) | loopback, 4 workers, 2 cores | "
                          "1.10× (0.90–1.30) | – | – | 3 |")
    with pytest.raises(ValueError, match="status markers"):
        status.replace_block("no markers here", status.block([only]))
