"""Bad input gets an error naming the cause and the fix, on every rank, before any state changes.

Real mpirun jobs; every scenario must end well inside its time limit (no hang).
"""
import json
import os

import pytest

from tests.support.jobs import run_job, run_python

RANKS = 3


@pytest.fixture(scope="module")
def bad_calls(tmp_path_factory):
    out = tmp_path_factory.mktemp("bad")
    result = run_job(RANKS, "bad_inputs.py", [out], timeout=120)
    assert result.returncode == 0, result.output[-4000:]
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(RANKS)]


# scenario -> words the message must contain (the cause, who, and the fix)
EXPECTED = {
    "unknown_key_all_ranks": ["key 99 was never initialised", "call init(99, value)"],
    "unknown_key_one_rank": ["failed on rank 1:", "key 99 was never initialised"],
    "push_never_initialised": ["push failed", "key 98 was never initialised"],
    "broadcast_shape_differs": ["differs between ranks", "rank 1 called broadcast key 7 shape (4, 5)",
                                "ranks 0, 2 called broadcast key 7 shape (4, 4)"],
    "init_dtype_differs": ["differs between ranks", "float64", "float32"],
    "value_shape_one_rank": ["failed on rank 2:", "shape (2, 8)", "initialised with shape (4, 4)"],
    "out_length_differs": ["out of key 0 has 1 array(s) but value has 2", "one out array per value"],
    "out_shape_differs": ["failed on rank 0:", "out of key 0 has shape (4, 3)",
                          "pass out arrays of the value's shape"],
    "bad_key_type": ["key must be an int or a str, got float 1.5"],
    "unhashable_key_push": ["key must be an int or a str, got dict"],
    "unhashable_key_row_sparse_pull": ["key must be an int or a str, got list"],
    "init_twice": ["key 0 is already initialised", "broadcast()"],
    "str_key_init_in_int_store": ["init failed", "key 'a' is a str, but this store's keys are "
                                  "ints (the first: 0)", "use int keys"],
    "str_key_push_in_int_store": ["key 'a' is a str, but this store's keys are ints"],
    "str_key_pull_in_int_store": ["key 'a' is a str, but this store's keys are ints"],
    "keys_mix_types": ["key 'a' is a str, but this store's keys are ints"],
    "new_keys_mix_types": ["key 3 is an int, but this store's keys are strs (the first: 'b')"],
    "int_key_init_in_str_store": ["key 3 is an int, but this store's keys are strs (the "
                                  "first: 'a')", "use str keys"],
    "int_key_pushpull_in_str_store": ["key 3 is an int, but this store's keys are strs"],
    "int_key_row_sparse_pull_in_str_store": ["key 3 is an int, but this store's keys are strs"],
    "optimizer_differs": ["set_optimizer differs between ranks", "learning_rate=0.1",
                          "learning_rate=0.2"],
    "optimizer_states_differ": ["load_optimizer_states differs between ranks", "sha256"],
    "sparse_push_shape_one_rank": ["failed on rank 1:", "shape (1000, 3)",
                                   "initialised with shape (1000, 4)"],
    "sparse_push_keys_differ": ["push differs between ranks", "key 21", "key 20"],
    "sparse_push_unknown_key_one_rank": ["failed on rank 1:", "key 99 was never initialised"],
    "sparse_push_against_pushpull": ["differs between ranks", "pushpull key 0", "push key 20"],
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_error_raised_on_every_rank_with_cause_and_fix(bad_calls, scenario):
    messages = [results[scenario] for results in bad_calls]
    assert all(m is not None for m in messages), f"some rank raised nothing: {messages}"
    assert len(set(messages)) == 1, f"ranks raised different errors: {messages}"
    for words in EXPECTED[scenario]:
        assert words in messages[0], f"{words!r} missing from: {messages[0]}"


def test_pull_of_unknown_key_raises_locally(bad_calls):
    for results in bad_calls:
        assert "key 97 was never initialised" in results["pull_never_initialised"]


def test_errors_change_no_state_and_ranks_stay_in_step(bad_calls):
    for results in bad_calls:
        assert results["value_after_errors"] == 10.0  # init value survived the failed push
        assert results["sum_after_errors"] == sum(range(1, RANKS + 1))
        assert results["sparse_after_errors"] == RANKS   # (the last good push's sum of ones)
        assert results["sparse_sum_after_errors"] == sum(range(1, RANKS + 1))


def test_create_outside_mpi_job_says_how_to_launch():
    r = run_python("import mxnet as mx, kvhybrid; mx.kv.create('hybrid-mpi')", timeout=60)
    assert r.returncode != 0
    assert "NotInMPIJobError" in r.output
    assert "not started by an MPI launcher" in r.output and "mpirun -np 4 python train.py" in r.output
    # the message is the last thing printed: no traceback of the half-made store after it
    assert "Exception ignored" not in r.output and "has no attribute 'handle'" not in r.output


def test_create_with_mpi_unavailable_says_what_to_install():
    # mpi4py made unimportable, as on a machine without it; MPI itself is not mocked.
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import mxnet as mx, kvhybrid; mx.kv.create('hybrid-mpi')")
    r = run_python(code, timeout=60, env={"KVHYBRID_ALLOW_SINGLETON": "1"})
    assert r.returncode != 0
    assert "cannot load MPI" in r.output and "pip install mpi4py" in r.output


def test_singleton_allowed_when_asked():
    code = ("import mxnet as mx, kvhybrid\nkv = mx.kv.create('hybrid-mpi')\n"
            "a = mx.nd.ones((3,)); kv.init(0, a); kv.pushpull(0, a)\n"
            "print('ok', kv.rank, kv.num_workers, a.asnumpy().tolist())")
    r = run_python(code, timeout=60, env={"KVHYBRID_ALLOW_SINGLETON": "1"})
    assert r.returncode == 0, r.output
    assert "ok 0 1 [1.0, 1.0, 1.0]" in r.output


def test_bad_setting_names_variable():
    r = run_job(2, "create_store.py", timeout=60, env={"KVHYBRID_TIMEOUT": "soon"})
    assert r.returncode != 0
    assert "KVHYBRID_TIMEOUT='soon' is not a number" in r.output


@pytest.mark.parametrize("env, words, store", [
    ({"KVHYBRID_ROW_MASTERS": "host"}, ["KVHYBRID_ROW_MASTERS=host sends each host's rows to the "
                                        "parameter servers, and this job has none", "add servers"],
     "hybrid-mpi"),
    # what kvhybrid-launch sets by default for one group across hosts, with an asynchronous
    # store: refused, saying which launcher flag gives the group master back
    ({"KVHYBRID_ROW_MASTERS": "host", "DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "1",
      "DMLC_NUM_WORKER": "1", "KVHYBRID_SECRET": "k" * 64},
     ["is for the synchronous hybrid-mpi store, not hybrid-mpi-async", "--row-masters group"],
     "hybrid-mpi-async"),
    # 2 emulated hosts, but ps-lite told to expect 3 workers: refused before connecting
    ({"KVHYBRID_ROW_MASTERS": "host", "KVHYBRID_EMULATE_NODE_SIZE": "1", "DMLC_ROLE": "worker",
      "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "3", "KVHYBRID_SECRET": "k" * 64},
     ["each of the group's 2 hosts a ps-lite worker, but DMLC_NUM_WORKER is 3",
      "set DMLC_NUM_WORKER=2"], "hybrid-mpi"),
])
def test_row_masters_per_host_refused_on_every_rank_before_connecting(env, words, store,
                                                                    tmp_path):
    r = run_job(2, "create_store.py", [store, tmp_path], timeout=60, env=env)
    assert r.returncode != 0
    for rank in range(2):   # each rank wrote what refused it (read from files, not mpirun's
        refused = tmp_path / f"refused-rank{rank}.txt"   # interleaved output)
        assert refused.exists(), (rank, r.output[-3000:])
        text = refused.read_text()
        assert text.startswith("ConfigError: "), text
        for words_ in words:
            assert words_ in text, (rank, text)
