"""The store's step clock and the stats file it writes for the tuners
(``kvhybrid/kvstore/stats.py``): steps counted by the first key, the report as step
KVHYBRID_STATS_STEPS begins, the file written whole."""
import json
from types import SimpleNamespace

import pytest

from kvhybrid.config import StoreConfig
from kvhybrid.kvstore.stats import StepClock, write_stats


def test_the_report_comes_once_as_its_step_begins():
    reports = []
    clock = StepClock(3, lambda: reports.append(clock.steps))
    for _ in range(5):
        clock.tick("w")   # the first key: a step
        clock.tick("b")   # another key of the same step
    assert clock.steps == 5 and reports == [3] and len(clock.step_seconds()) == 4
    silent = StepClock(0, lambda: reports.append("never"))
    silent.tick("w")
    assert reports == [3]


def test_the_stats_file_is_written_whole_with_its_steps(tmp_path):
    path = tmp_path / "stats.json"
    config = SimpleNamespace(stats_file=str(path), partitions=2, num_servers=1)
    placement = SimpleNamespace(num_workers=4, num_clients=2, servers=None)
    clock = StepClock()
    for _ in range(4):
        clock.tick(0)
    write_stats(config, placement, clock, {5: {"rows": 10}})
    stats = json.loads(path.read_text())
    assert stats["steps"] == 4 and len(stats["step_seconds"]) == 3
    assert (stats["workers"], stats["clients"], stats["servers"], stats["partitions"]) == \
        (4, 2, 1, 2)
    assert stats["keys"] == {"5": {"rows": 10}} and [p.name for p in tmp_path.iterdir()] == \
        ["stats.json"]


def test_stats_steps_is_read_and_checked():
    assert StoreConfig.from_env({"KVHYBRID_STATS_STEPS": "24"}).stats_steps == 24
    assert StoreConfig.from_env({}).stats_steps == 0
    with pytest.raises(Exception, match="KVHYBRID_STATS_STEPS"):
        StoreConfig.from_env({"KVHYBRID_STATS_STEPS": "-1"})
