"""Small dense keys travel to the servers packed (kvstore/ps/packs.py): a few ps-lite requests a
step instead of two per key (ps-lite keeps 8 bytes per request for good), with the same
weights as a plain replay, also for a call that pushes part of a pack or one packed key.

Real launched jobs: client groups, ps-lite servers, SGD with momentum on the servers.
"""
import json
import re

import pytest

from tests.support.jobs import run_launcher


def requests_per_step(output: str):
    return [int(n) for n in re.findall(r"(\d+) ps-lite requests in step 2", output)]


# 40 small keys and a big one, a push and a pull each: a pack per server that holds some of
# the small keys (MXNet puts key k on server k * 9973 % servers; a pack joins its members
# there), and the big key on its own
@pytest.mark.parametrize("shape,requests", [(["-n", 2, "--clients", 2, "--servers", 1], 4),
                                            (["-n", 4, "--clients", 2, "--servers", 2], 6)],
                         ids=["2x1-1server", "2x2-2servers"])
def test_packed_keys_train_as_a_plain_replay_with_a_few_requests(tmp_path, shape, requests):
    r = run_launcher(shape, "packed_keys.py", [tmp_path], timeout=180)
    assert r.returncode == 0, r.output[-3000:]
    assert json.loads((tmp_path / "result.json").read_text())["worst"] < 1e-5, r.output[-2000:]
    counts = requests_per_step(r.output)
    assert len(counts) == 2, r.output[-2000:]   # one line per master
    assert counts == [requests, requests], r.output[-2000:]   # not 82


def test_without_packing_each_key_is_two_requests(tmp_path):
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "packed_keys.py", [tmp_path],
                     timeout=180, env={"KVHYBRID_PACK_KEYS": "0"})
    assert r.returncode == 0, r.output[-3000:]
    assert json.loads((tmp_path / "result.json").read_text())["worst"] < 1e-5
    assert requests_per_step(r.output) == [82, 82]
