"""Engine-scheduled collectives: the dense path that overlaps backward.

Real mpirun jobs; each rank writes what it saw to a file (tests/mpi/workers/engine_ops.py).
Equivalence of training through the engine path with one process is in
test_equivalence.py (the engine path is the default there; one shape turns it off).
"""
import json

import pytest

from tests.support.jobs import run_job


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    out = tmp_path_factory.mktemp("engine")
    result = run_job(2, "engine_ops.py", [out], timeout=180)
    assert result.returncode == 0, result.output[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_submit_returns_before_the_inputs_are_computed(seen):
    assert all(s["returns_early"] for s in seen), seen


def test_collectives_run_in_submission_order_whatever_the_engine_finishes_first(seen):
    # "fast" is ready at once and "slow" only once the worker lets it go: MPI must still
    # see slow first, and nothing of fast while slow is held
    assert all(s["fast_held_back"] for s in seen), seen
    assert all(s["order"] == ["slow", "fast"] for s in seen), seen
    assert all(s["sums_right"] for s in seen), seen


def test_a_failing_collective_completes_and_raises_on_the_callers_thread(seen):
    for s in seen:
        assert s["waitall_returned_s"] < 30, s
        assert s["error"] and "broken-bucket" in s["error"] and "injected failure" in s["error"], s


def test_a_lone_pushpull_sums_in_its_own_array_and_leaves_values_it_must_keep(seen):
    # three calls of one key, no out or the value as the out: all summed in place (no copy
    # in or out), each summing the one before's sums; another out keeps the value; one
    # array for two keys is copied
    assert all(s["lone_in_place"] == 3 for s in seen), seen
    assert all(s["lone_sums_right"] for s in seen), seen
    assert all(s["lone_out_and_shared_right"] for s in seen), seen


def test_gradients_in_shared_buffers_are_copied_by_their_allreduce(seen):
    # with outs given, a bucket's allreduce copies the buffer its gradients lie in (no copy
    # operator) and the gradients stay; a bucket whose gradients an out of the call lies in
    # (an earlier bucket's, or its own) is copied first, and sums what they held at the call
    assert all(s["copies_apart"] == 0 and s["apart_right"] for s in seen), seen
    assert all(s["copies_into_next"] == 1 and s["into_next_right"] for s in seen), seen
    assert all(s["copies_into_own"] == 1 and s["into_own_right"] for s in seen), seen


def test_pushpull_returns_while_backward_runs_and_updates_right(seen):
    assert all(s["pushpull_early"] for s in seen), seen
    assert all(s["bias_right"] for s in seen), seen


def test_calls_sharing_a_key_update_its_current_weight(seen):
    # each call's bucket moves its keys' weights into one buffer; the call that comes
    # next must update the weight the other moved, not a stale copy
    assert all(s["shared_key_right"] for s in seen), seen
    assert seen[0]["shared_key_steps"] == {"100": 2, "101": 4, "102": 2}, seen
    # each call's bucket is updated once over its flat weights: by the C++ helper in its
    # allreduce (scripts/setup.sh builds it), no SGD operator pushed
    assert all(s["flat_update_cpp"] == 4 and s["flat_update_ops"] == 0 for s in seen), seen


def test_repeated_calls_in_different_orders_raise_the_same_error_on_every_rank(seen):
    errors = [s["out_of_order_error"] for s in seen]
    assert errors[0] and len(set(errors)) == 1, errors
    for words in ("pushpull differs between ranks", "rank 0 called pushpull key 200",
                  "rank 1 called pushpull key 201", "same calls, in the same order"):
        assert words in errors[0], errors[0]


def test_a_repeated_calls_agreement_travels_in_its_buckets_meeting_on_one_host(seen):
    # one collective a call with a host barrier (tests/mpi/test_host_barrier.py: there is
    # one where the helper was built), two without: the agreement's own and the bucket
    for s in seen:
        assert s["repeated_call_collectives"] == (3 if s["meets_on_host"] else 6), seen
