"""python -m experiments.papers: every part of the papers' page (the six modes, the models
and their α sweep, the densified architectures, the partition tuner) run for real on
emulated hosts at a tiny size, and the page written from their results."""
import re
import sys

import pytest

from tests.support.jobs import _run_killable
from tests.support.netns import netns_available

CLAIMS = ["mpi-SGD's epoch is shorter", "mpi-ESGD reaches the target accuracy first",
          "Table 6", "Table 3", "Table 5", "Table 4"]


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add)")
def test_every_claim_gets_figures_from_a_tiny_run_on_emulated_hosts(tmp_path):
    cmd = [sys.executable, "-m", "experiments.papers", "--tiny", "--rates", "1gbit",
           "--rounds", "1", "--out", str(tmp_path)]
    r = _run_killable(cmd, "the papers' settings at a tiny size", 900, {})
    assert r.returncode == 0, r.output[-4000:]
    page = (tmp_path / "papers.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and "§" in line]
    assert len(rows) == len(CLAIMS)
    for claim in CLAIMS:
        (row,) = [line for line in rows if claim in line]
        cells = [c.strip() for c in row.strip("|").split("|")]
        ours, verdict = cells[2], cells[3]
        assert ours != "not measured" and re.search(r"\d", ours), row
        assert verdict in ("reproduced", "reproduced in shape", "not reproduced"), row
    assert "| 1gbit | 10 |" in page and "| 1gbit | 50 |" in page   # the α sweep's rows
    assert (tmp_path / "papers_alpha.png").stat().st_size > 10_000
    for part in ("modes_1gbit/experiments.md", "models_1gbit.md", "dense_1gbit.md",
                 "partitions_1gbit.md"):
        assert (tmp_path / "papers" / part).is_file(), part
    # a second run keeps what is measured and only writes the page again
    again = _run_killable(cmd, "the papers' page again", 300, {})
    assert again.returncode == 0, again.output[-4000:]
    assert again.output.count(": kept (") == 4
