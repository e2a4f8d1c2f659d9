"""A row_sparse table split into P pieces on the servers (Parallax's partitions) gives the
values of an unsplit one, for random row sets and the rows on piece boundaries; bad P
values fail with the fix."""
import json
import re

import pytest

from kvhybrid.config import StoreConfig
from kvhybrid.errors import ConfigError
from tests.support.jobs import run_launcher


def test_split_table_answers_like_the_whole_one(tmp_path):
    out = tmp_path / "partitions.json"
    r = run_launcher(["-n", 1, "--servers", 2], "partitions.py", [out], timeout=240)
    assert r.returncode == 0, r.output[-4000:]
    res = json.load(open(out))
    assert res["bounds"] == [0, 4, 9, 13, 18, 23]
    for step in res["steps"]:
        assert {0, 3, 4, 8, 9, 12, 13, 17, 18, 22} <= set(step["pulled"])
        assert step["split_vs_whole"] == 0.0, step
        assert step["split_vs_numpy"] < 1e-6, step
    assert any({3, 4, 17, 18} <= set(s["pushed"]) for s in res["steps"])
    assert res["all_rows_vs_numpy"] < 1e-6


@pytest.mark.parametrize("value", ["0", "-2", "many", "100000"])
def test_partitions_outside_1_to_max_are_refused(value):
    with pytest.raises(ConfigError, match="KVHYBRID_PARTITIONS"):
        StoreConfig.from_env({"KVHYBRID_PARTITIONS": value})


def test_more_pieces_than_the_servers_can_hold_fail_on_every_rank():
    # 10 rows in 6 pieces over 2 servers: a piece of one row, which one server would not get
    r = run_launcher(["-n", 2, "--servers", 2], "small_table.py", timeout=240,
                     env={"KVHYBRID_PARTITIONS": "6"})
    assert r.returncode != 0
    for rank in (0, 1):  # the same error on both ranks, with the fix
        assert re.search(f"rank {rank} refused: .*set KVHYBRID_PARTITIONS to at most 5",
                         r.output), r.output[-3000:]
