"""The store's API (init/push/pull/pushpull/broadcast, optimizer, Gluon integration), under mpirun."""
import json
import os
import re

import pytest

from tests.support.jobs import run_job, run_launcher

CHECKS = [
    "type_is_distributed_sync", "rank_and_num_workers", "is_native_kvstore_subclass",
    "capable_of_optimizer", "create_by_type_round_trips", "init_value_is_rank0s",
    "push_stores_sum", "pushpull_out_sums", "pushpull_out_keeps_value", "pushpull_in_place_sums",
    "key_lists", "broadcast_gives_rank0s", "broadcast_again_overwrites",
    "push_with_optimizer_updates", "gradient_compression_after_push_refused", "row_sparse_pull_needs_row_sparse_out",
    "row_sparse_pull_of_a_dense_key",
    "trainer_by_type_string", "trainer_states_round_trip", "trainer_weights_equal_on_ranks",
    "is_capable_is_static", "pull_without_ignore_sparse_gives_every_row",
    "pull_without_ignore_sparse_of_key_lists", "pushpull_out_of_another_dtype_is_cast",
    "broadcast_out_of_another_dtype_is_cast",
]


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("api")
    job = run_job(3, "store_api.py", [out], timeout=120)
    assert job.returncode == 0, job.output[-4000:]
    return json.load(open(os.path.join(out, "api.json")))


@pytest.mark.parametrize("name", CHECKS)
def test_store_behaviour(checks, name):
    assert name in checks, f"check {name} did not run"
    ok, detail = checks[name]
    assert ok, detail


def test_barrier_spans_every_client_group():
    r = run_launcher(["-n", 4, "--clients", 2, "--servers", 1], "barrier.py", timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    waited = {int(m[0]): float(m[1]) for m in re.findall(r"rank (\d) waited ([\d.]+) s", r.output)}
    assert sorted(waited) == [0, 1, 2, 3]
    assert min(w for rank, w in waited.items() if rank != 0) > 1.5, waited  # all waited for rank 0
