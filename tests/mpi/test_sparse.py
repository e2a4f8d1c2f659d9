"""Sparse models through hybrid-mpi equal single-process training, with and without servers.

Both Gluon paths: a dense weight with row_sparse gradients (nn.Embedding(sparse_grad=True);
MXNet's own dist_sync crashes its servers on it, MXNet issues #19949, #21118) and a sparse
weight (contrib.nn.SparseEmbedding), next to dense layers, for pure MPI (rows gathered with
Allgatherv), one client group with a server, two groups, and pure PS (a group per worker).
"""
import json

import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon

from tests.support.jobs import run_job, run_launcher
from tests.mpi.workers.sparse_models import make_sparse_net, make_trainer, set_weights, sparse_batch, trained_weights
from tests.mpi.workers.sparse_models import SMALL_TABLE

STEPS, PER_DEVICE = 4, 5
# (workers, devices per worker, client groups, servers): pure MPI, one group with a server,
# two groups, pure PS (a group per worker)
SHAPES = [(2, 1, 1, 0), (4, 2, 1, 0), (4, 1, 1, 1), (4, 1, 2, 2), (4, 1, 4, 2)]
# tables split into 3 pieces on the servers (KVHYBRID_PARTITIONS): one group with a server,
# and two groups with two servers (each piece split over both)
SHAPES += [(4, 1, 1, 1, 3), (4, 1, 2, 2, 3)]
# rows aggregated per host (--row-masters host) on 2 emulated hosts of 2 ranks: each host's
# first rank pushes its host's rows; with 2 devices per worker and 2 pieces too
SHAPES += [(4, 1, 1, 2, 1, "host"), (4, 2, 1, 1, 2, "host")]
KINDS = ["grad", "weight"]


def _id(s) -> str:
    return f"{s[0]}workers-{s[1]}dev-{s[2]}clients-{s[3]}servers" + \
        (f"-{s[4]}pieces" if len(s) > 4 else "") + (f"-{s[5]}-masters" if len(s) > 5 else "")


#: the folders train_sparse.py's runs left, by shape and settings: a run two fixtures ask
#: for (a prefetch shape's plain pulls that are also a shape of their own) runs once
_RUNS: dict = {}


def trained(tmp_path_factory, shape, prefetch: bool, helper: bool = True):
    """A folder with both models trained by train_sparse.py on ``shape`` (workers, devices,
    client groups, servers[, pieces[, row masters]]), one job per model with servers (one
    store per process)."""
    ranks, ndev, clients, servers = shape[:4]
    env = {"KVHYBRID_PARTITIONS": str(shape[4] if len(shape) > 4 else 1),
           "KVHYBRID_TEST_PREFETCH": "1" if prefetch else "0"}
    if not helper:
        env["KVHYBRID_CPP_HELPER"] = "0"
    extra = []
    if len(shape) > 5:
        env["KVHYBRID_EMULATE_NODE_SIZE"] = "2"
        extra = ["--row-masters", shape[5]]
    key = (ranks, ndev, clients, servers, tuple(sorted(env.items())), tuple(extra))
    if key in _RUNS:
        return _RUNS[key]
    out = tmp_path_factory.mktemp(f"sparse-{_id(shape)}")
    for kind in KINDS:
        args = [out, ndev, STEPS, PER_DEVICE, kind]
        if servers == 0:
            r = run_job(ranks, "train_sparse.py", args, timeout=240, env=env)
        else:
            r = run_launcher(["-n", ranks, "--clients", clients, "--servers", servers, *extra],
                             "train_sparse.py", args, timeout=240, env=env)
        assert r.returncode == 0, r.output[-4000:]
    _RUNS[key] = out
    return out


@pytest.fixture(scope="module", params=SHAPES, ids=_id)
def sparse_job(request, tmp_path_factory):
    ranks, ndev = request.param[:2]
    return ranks, ndev, trained(tmp_path_factory, request.param, prefetch=False)


def reference(kind: str, init: dict, ranks: int, ndev: int) -> dict:
    """One process, one device, the union batch; step(per-worker batch): dist_sync semantics."""
    net = make_sparse_net(kind)
    net.initialize(ctx=mx.cpu())
    set_weights(net, init)
    # kvstore=None for a dense weight; a sparse weight needs a store, the native local one
    trainer, step_arg = make_trainer(net, kind, None if kind == "grad" else "local",
                                     ndev * PER_DEVICE)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        x, y = sparse_batch(step, ranks * ndev * PER_DEVICE)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(step_arg)
    return trained_weights(net)


@pytest.mark.parametrize("kind", KINDS, ids=["sparse_grad", "SparseEmbedding"])
def test_sparse_models_match_single_process(sparse_job, kind):
    ranks, ndev, out = sparse_job
    assert_matches_single_process(out, kind, ranks, ndev)


def assert_matches_single_process(out, kind: str, ranks: int, ndev: int) -> None:
    """Every rank's weights, written by train_sparse.py into ``out``, equal one process's."""
    init = dict(np.load(out / f"{kind}-init.npz"))
    ref = reference(kind, init, ranks, ndev)
    for rank in range(ranks):
        got = np.load(out / f"{kind}-rank{rank}.npz")
        assert sorted(got.files) == sorted(ref)
        for name, want in ref.items():
            err = np.linalg.norm(got[name] - want) / np.linalg.norm(want)
            assert err <= 1e-5, f"rank {rank} {name}: relative error {err:.2e}"
    for name in ref:   # every parameter trained, the table included
        moved = np.linalg.norm(ref[name] - init[name]) / max(np.linalg.norm(init[name]), 1.0)
        assert moved > 1e-3, f"{name} did not train: the comparison would prove nothing"


# the next batch's rows prefetched (kvhybrid.prefetch): one group with a server (1 and 2
# devices per worker), two groups with tables in 3 pieces on 2 servers, and rows aggregated
# per host (2 emulated hosts of 2 ranks, a server each): each host's master hands its host's
# prefetched rows out; a client group per worker (all-PS: a group of one pushes its rows and
# fetches the next ones through MXNet's engine, as dist_sync, and checks its pulls alone). The 2-device shape runs without the C++ helper, as on a machine without a
# compiler (row ids read through MXNet's engine on the caller's thread)
PREFETCH_SHAPES = [(4, 1, 1, 1, 1), (4, 2, 1, 1, 1), (4, 1, 2, 2, 3), (4, 1, 1, 2, 1, "host"),
                   (2, 1, 2, 1, 1)]


@pytest.fixture(scope="module", params=PREFETCH_SHAPES, ids=_id)
def prefetch_job(request, tmp_path_factory):
    """The same training with plain pulls (``plain``) and with prefetched rows (``out``)."""
    ranks, ndev, clients = request.param[:3]
    helper = ndev == 1
    plain = trained(tmp_path_factory, request.param, prefetch=False, helper=helper)
    out = trained(tmp_path_factory, request.param, prefetch=True, helper=helper)
    return ranks, ndev, len(request.param) > 5, clients == ranks, out, plain


@pytest.mark.parametrize("kind", KINDS, ids=["sparse_grad", "SparseEmbedding"])
def test_prefetched_rows_train_bit_for_bit_like_plain_pulls(prefetch_job, kind):
    ranks, ndev, _, _, out, plain_out = prefetch_job
    assert_matches_single_process(out, kind, ranks, ndev)
    for rank in range(ranks):
        got = np.load(out / f"{kind}-rank{rank}.npz")
        plain = np.load(plain_out / f"{kind}-rank{rank}.npz")
        for name in plain.files:
            assert np.array_equal(got[name], plain[name]), f"rank {rank} {name} differs"


def test_pulls_and_pushes_meet_no_one_after_the_first_push(prefetch_job):
    # a sparse weight's pull through the master meets the group 3 times (agreement, ids,
    # rows) and a push twice (agreement, the rows' gather). Once its route is known (its
    # first push, which agrees first), every push hands its rows to the communication
    # thread, with the next ids where the script prefetched them, and every pull takes
    # prefetched rows or is served there (the rows of a script that never prefetches, and
    # the final whole-table pull): the rows meet no one on the caller's thread, prefetched
    # or not. What meets there in a step is the dense keys' sum across client groups.
    ranks, ndev, _, alone, out, plain_out = prefetch_job
    for rank in range(ranks):
        stats = {folder: json.load(open(folder / f"weight-stats-rank{rank}.json"))
                 for folder in (out, plain_out)}
        per_step = {}
        for folder, s in stats.items():
            after = s["meetings_after_step"]
            per_step[folder] = [b - a for a, b in zip(after, after[1:])]
        got, plain = (stats[f]["collectives"] for f in (out, plain_out))
        assert per_step[out] == per_step[plain_out], (per_step, got, plain)
        assert len(set(per_step[out])) == 1, per_step
        assert got["group"] == plain["group"], (got, plain)
        if alone:   # a group of one rank: its rows go through MXNet's engine, as dist_sync's,
            # and no collective of its own runs at all
            assert got["engine"] == 0 and plain["engine"] == 0, (got, plain)
            continue
        # the rows came from the communication thread: its collectives did the work
        assert got["engine"] >= 2 * (STEPS - 1) and plain["engine"] >= 2 * (STEPS - 1), \
            (got, plain)


@pytest.mark.parametrize("shape", [(2, 1, 0), (4, 2, 1)], ids=["pure-mpi", "2clients-1server"])
@pytest.mark.parametrize("touched", [0.01, 0.10])
def test_row_sparse_traffic_scales_with_rows_touched(tmp_path, touched, shape):
    # A 1M-row table: each worker pushes gradients for a fraction of its rows, twice.
    ranks, clients, servers = shape
    if servers == 0:
        r = run_job(ranks, "sparse_traffic.py", [tmp_path, touched], timeout=240)
    else:
        r = run_launcher(["-n", ranks, "--clients", clients, "--servers", servers],
                         "sparse_traffic.py", [tmp_path, touched], timeout=240)
    assert r.returncode == 0, r.output[-4000:]
    ranks_sent = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in range(ranks)]
    union = set().union(*(s["ids"] for s in ranks_sent))
    for rank, s in enumerate(ranks_sent):
        fraction = sum(s["sent"].values()) / s["table_bytes"]
        # ids (8 bytes) travel with each row (32 bytes): 1.25x the rows' share of the table;
        # a master also pushes its group's union of rows (here 2 workers' rows) to the servers
        limit = 1.3 if servers == 0 or rank % (ranks // clients) else 1.3 + 2 * 1.3
        assert touched <= fraction <= limit * touched, f"rank {rank} sent {fraction:.2%}"
        assert s["sent"]["dense"] == 0
        if servers:
            assert (s["sent"]["servers"] > 0) == (rank % (ranks // clients) == 0)
        # the sum of both pushes landed: every touched row, each worker's 1s counted twice
        assert s["stored_rows_nonzero"] == len(union)
        assert s["stored_max"] >= 2.0


def test_row_sparse_push_to_servers_before_set_optimizer_is_refused_on_every_rank():
    # Without an optimizer the servers overwrite rows instead of summing them: silently wrong.
    r = run_launcher(["-n", 2, "--clients", 1, "--servers", 1], "sparse_no_optimizer.py",
                     timeout=120)
    assert r.returncode != 0
    for rank in range(2):
        assert f"rank {rank} raised: push failed on ranks 0, 1: push of row_sparse gradients " \
            "of key 'table' to the parameter servers needs an optimizer there" in r.output, \
            r.output[-3000:]
    assert "call set_optimizer first" in r.output


@pytest.mark.parametrize("shape", [(2, 1, 1, []), (4, 2, 3, ["--row-masters", "host"])],
                         ids=["group-master", "host-masters"])
def test_prefetching_push_with_a_wrong_call_raises_on_every_rank_and_pushes_nothing(tmp_path,
                                                                                    shape):
    """The push's agreement rides in the rows' gather (no meeting of its own): a wrong call
    on one rank stops the push at the master, and every rank raises at its next call. With
    host masters (2 emulated hosts of 2 ranks) the wrong call is on the second host, which
    its host's master alone would not see: the group's agreement on the communication
    thread stops it on both hosts. Row ids outside the table raise at prefetch_rows."""
    ranks, servers, bad_rank, extra = shape
    r = run_launcher(["-n", ranks, "--servers", servers, *extra], "prefetch_mismatch.py",
                     [tmp_path, bad_rank], timeout=120,
                     env={"KVHYBRID_EMULATE_NODE_SIZE": "2"} if extra else None)
    assert r.returncode == 0, r.output[-3000:]
    for rank in range(ranks):
        got = json.load(open(tmp_path / f"mismatch-rank{rank}.json"))
        assert got["push_returned"] and got["raised"] == "KeyValueError", got
        assert got["message"].startswith(f"push failed on rank {bad_rank}: key 'w' holds a "
                                         "sparse weight"), got
        assert got["requests_sent"] == 0, got
        assert sorted(got["bad_ids"]) == sorted(["[0, -1, 2]", f"[0, {SMALL_TABLE[0]}, 2]"]), \
            got
        assert "got row id -1, outside the table's" in got["bad_ids"]["[0, -1, 2]"], got
        past = f"[0, {SMALL_TABLE[0]}, 2]"
        assert f"got row id {SMALL_TABLE[0]}, outside" in got["bad_ids"][past], got


def test_a_pull_of_row_sparse_outs_only_is_skipped_and_still_agreed(tmp_path):
    """MXNet's stores skip row_sparse outs of a pull, and so does the store, on every rank;
    a rank that pulls a dense key while another pulls only row_sparse outs makes every rank
    raise the same error, and the store goes on."""
    r = run_launcher(["-n", 2, "--servers", 1], "pull_sparse_outs.py", [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"pull-rank{rank}.json")) for rank in range(2)]
    for g in got:
        assert g["skipped_rows"] == 0, g
        assert g["raised"] == "KeyValueError" and "differs between ranks" in g["message"], g
        assert g["dense_after"] == [5.0, 5.0, 5.0], g
        assert g["rows_after"] == [[0.0] * 4, [0.0] * 4], g   # rows 0 and 1, pushed once each
    assert got[0]["message"] == got[1]["message"]


@pytest.mark.parametrize("ranks, servers, clients", [(2, 1, 1), (4, 2, 1), (2, 1, 2)])
def test_a_pull_after_a_push_that_asked_for_no_rows_takes_ids_as_handed_and_names_a_bad_one(
        tmp_path, ranks, servers, clients):
    """A loop without kvhybrid.prefetch: its pull's ids, float32 or int64, unsorted and
    repeated, get the rows the servers updated; ids outside the table raise on the rank that
    passed them, at its pull. In a group every other rank raises at a later call, and
    nothing more reaches the servers; a group per worker goes on training."""
    r = run_launcher(["-n", ranks, "--servers", servers, "--clients", clients],
                     "served_pull_ids.py", [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    # one push of every rank: rows r and 10 + r of the ones go down by 1
    touched = set(range(ranks)) | {10 + n for n in range(ranks)}
    ids = [0, 1, 10, 12]
    expected = {"ids": ids, "rows": [0.0 if i in touched else 1.0 for i in ids]}
    error = (f"row_ids of key 'w' hold {SMALL_TABLE[0] + 5}, outside the table's "
             f"{SMALL_TABLE[0]} rows")
    for rank in range(ranks):
        got = json.load(open(tmp_path / f"served-rank{rank}.json"))
        assert got["rows"] == {"float32": expected, "int64": expected}, got
        if rank == ranks - 1:
            assert error in got["pull"], got
        else:
            assert got["pull"] is None, got
        if clients == 1:
            if rank != ranks - 1:
                assert got["next"].startswith(f"row_sparse_pull failed on rank {ranks - 1}: "
                                              + error), got
            assert got["requests_sent"] == 0, got
        else:   # six pushes of rows 0 and 1 by their ranks, each -1
            assert got["next"] is None and got["last"] == [-5.0, -5.0], got


def test_a_pull_through_mxnets_engine_waits_for_a_push_on_the_communication_thread(tmp_path):
    """A group per worker: a gradient in two arrays goes to the communication thread, which a
    job holds for a second; the next pull, through MXNet's engine, still reads the rows that
    push updated (both pushes took rows 0 + rank and 10 + rank of the ones down by 1)."""
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "held_push_then_pull.py",
                     [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    for rank in range(2):
        got = json.load(open(tmp_path / f"held-rank{rank}.json"))
        assert got == {"ids": [rank, 10 + rank], "rows": [-1.0, -1.0],
                       "released_before_the_rows": True}, got


def test_a_repeated_pull_of_row_sparse_outs_only_is_still_agreed(tmp_path):
    """The same skipped pull into the same out each step (Module's pull of a row_sparse
    weight after its push) is agreed on the communication thread: where rank 0 makes it once
    more than rank 1, both ranks raise the same error, at a later call, within the test's
    timeout."""
    r = run_launcher(["-n", 2, "--servers", 1], "skipped_pull_again.py", [tmp_path],
                     timeout=120, env={"KVHYBRID_TIMEOUT": "60"})
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"again-rank{rank}.json")) for rank in range(2)]
    for g in got:
        assert g["raised"] == "KeyValueError" and "differs between ranks" in g["message"], g
        assert g["at_step"] >= 2, g   # (steps 0 and 1 are the same on both ranks)
    assert got[0]["message"] == got[1]["message"]


@pytest.mark.parametrize("clients", [1, 3], ids=["one group", "a group per worker"])
def test_a_pull_of_every_row_beside_pulls_of_some_rows_gives_each_rank_its_rows(tmp_path,
                                                                                 clients):
    """Rank 0 pulls every row, rank 1 some (unsorted, repeated), rank 2 none, in one call:
    before the table's first push and after it, each rank gets the servers' values of the
    rows it asked for; then every rank pulls every row. Pulls after that and before the
    next push are served from the master's copy of the table, with no request to the
    servers; after the next push a pull of every row has the new values."""
    r = run_launcher(["-n", 3, "--clients", clients, "--servers", 1], "pull_every_row.py", [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    rows, width = 20, 4
    pushed = np.ones((rows, width))   # SGD (lr 1) of each rank's ones in rows r and 10 + r
    for rank in range(3):
        pushed[[rank, 10 + rank]] -= 1
    twice = pushed.copy()
    for rank in range(3):
        twice[[rank, 10 + rank]] -= 1
    asked = {0: list(range(rows)), 1: [1, 3], 2: []}
    for rank in range(3):
        got = json.load(open(tmp_path / f"every-rank{rank}.json"))
        for when, table in (("before_push", np.ones((rows, width))), ("after_push", pushed)):
            assert got[when]["ids"] == asked[rank], (rank, when, got[when])
            assert got[when]["rows"] == table[asked[rank]].tolist(), (rank, when, got[when])
        for when, ids, table in (("all_every_row", list(range(rows)), pushed),
                                 ("again_every_row", list(range(rows)), pushed),
                                 ("again_some", [2, 7], pushed),
                                 ("pushed_again", list(range(rows)), twice)):
            assert got[when]["ids"] == ids, (rank, when, got[when])
            assert got[when]["rows"] == table[ids].tolist(), (rank, when, got[when])
        # until the next push, the master's table of a pull of every row serves every pull
        assert got["requests_sent"] == 0, (rank, got["requests_sent"])


def test_a_prefetching_push_does_not_wait_for_a_late_master_and_pulls_updated_rows(tmp_path):
    """The ranks that only send their rows to the master go on without waiting for it (the
    rows go in the background; the verdict and the next rows come in the hand-out): rank 1
    returns from its push while the master is still HOLD seconds away, and what both pull
    next is the servers' update of both pushes."""
    r = run_launcher(["-n", 2, "--servers", 1], "prefetch_background_send.py", [tmp_path],
                     timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"background-rank{rank}.json")) for rank in range(2)]
    # rank 1 is back from its push before the master (HOLD s late) has even begun its own:
    # an order, not a duration (the old code returned only after the master had begun)
    assert got[1]["push_returned"] < got[0]["push_started"], got
    for g in got:   # ones, minus lr 1 × two pushes of the rows 0 and 10 (rank 0), 1 and 11
        assert g["indices"] == [0, 1, 10, 11] and g["pulled"] == [[-1.0, -1.0]] * 4, g


def test_a_prefetching_push_does_not_wait_for_another_ranks_late_pull(tmp_path):
    """Rank 1 pulls its prefetched rows HOLD seconds late: rank 0's next push (which
    prefetches) returns before rank 1 has even begun that pull, since the check that every
    rank had its rows runs on the communication threads; both then pull the servers'
    update of all three pushes."""
    r = run_launcher(["-n", 2, "--servers", 1], "prefetch_late_pull.py", [tmp_path],
                     timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"late-pull-rank{rank}.json")) for rank in range(2)]
    # an order, not a duration (the push used to wait for the check, hence for rank 1's pull)
    assert got[0]["push_returned"] < got[1]["pull_started"], got
    for g in got:   # ones, minus lr 1 × each push of rows 0 and 10 (rank 0), 1 and 11
        assert g["pulled"] == [-1.0] * 4 and g["pulled_after"] == [-2.0] * 4, g


def test_a_pull_the_prefetched_rows_miss_on_one_rank_is_served_on_the_communication_threads(
        tmp_path):
    """Rank 0's pull is among the prefetched rows, rank 1's is not: rank 0 goes on without
    meeting anyone on its caller's thread, and the communication threads serve rank 1 a
    plain pull, also in a loop that never meets; values are the plain pull's. A bad
    argument on rank 1 then raises on both ranks and pushes nothing."""
    r = run_launcher(["-n", 2, "--servers", 1], "prefetch_mixed.py", [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"mixed-rank{rank}.json")) for rank in range(2)]
    assert got[0]["pulled"] == [-1, -1, 1] and got[1]["pulled"] == [-1, -1, 1], got
    # no meeting on either caller's thread; rank 1's pull was served by the job on the
    # communication thread: the check (which carries the calls' agreement), ids and rows
    assert got[0]["pull_meetings"][0] == 0, got
    assert got[1]["pull_meetings"][0] == 0 and got[1]["pull_meetings"][1] == 3, got
    assert got[0]["served_by_a_pull"], got   # an evaluation loop serves it, no push needed
    assert got[1]["eval_pulled"] == [-3, 1], got
    expected = [-2 if i in (0, 1, 10, 11) else 1 for i in range(20)]
    for rank in range(2):
        assert got[rank]["after"] == expected, got[rank]
        assert got[rank]["raised"] == "KeyValueError", got[rank]
        assert got[rank]["message"].startswith(
            "row_sparse_pull failed on rank 1: out of row_sparse_pull of key 'w' is default"), \
            got[rank]
        assert got[rank]["requests_sent"] == 0, got[rank]


def test_a_pull_into_the_same_out_takes_the_prefetched_rows_in_a_few_calls(tmp_path):
    """Gluon pulls into the same row_sparse array every step: the pull of the handed ids
    skips the full checks from the second step on, with the plain pull's values; other ids
    in that out (the handed array rewritten in place) and another out take the full path,
    also when the other rank takes the short one in the same step."""
    r = run_launcher(["-n", 2, "--servers", 1], "prefetch_same_out.py", [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"same-out-rank{rank}.json")) for rank in range(2)]
    for rank in range(2):
        assert got[rank]["loop"] == [[-1, -1, 1], [-2, -2, 1], [-3, -3, 1]], got[rank]
        assert got[rank]["full_path_in_loop"] == 1, got[rank]   # the first pull only
        assert got[rank]["rewritten"] == [-4, -4, 1], got[rank]
    assert got[0]["other_out"] == [-6, -6, 1] and got[1]["other_out"] == [-6, -6, 1], got
    assert got[0]["uncovered"] == [-7, -7, 1] and got[1]["uncovered"] == [-7, -7, 1], got
    assert got[0]["full_path_mixed"] == 0 and got[1]["full_path_mixed"] == 2, got


@pytest.fixture(scope="module")
def tables_job(tmp_path_factory):
    """Two SparseEmbedding tables, one group with a server, rows prefetched: through
    kvhybrid.DistributedTrainer (both tables' rows in one push), through gluon.Trainer (a
    push per table), and through DistributedTrainer with plain pulls."""
    runs = {"fused": ("1", "1"), "gluon": ("0", "1"), "plain": ("1", "0")}
    out = tmp_path_factory.mktemp("tables")
    for name, (fused, prefetch) in runs.items():
        (out / name).mkdir()
        r = run_launcher(["-n", 4, "--clients", 1, "--servers", 1], "train_sparse.py",
                         [out / name, 1, STEPS, PER_DEVICE, "tables"], timeout=240,
                         env={"KVHYBRID_TEST_FUSED": fused, "KVHYBRID_TEST_PREFETCH": prefetch})
        assert r.returncode == 0, r.output[-4000:]
    return out


def test_two_tables_pushed_in_one_meeting_train_like_one_process(tables_job):
    assert_matches_single_process(tables_job / "fused", "tables", 4, 1)
    for rank in range(4):
        got = np.load(tables_job / "fused" / f"tables-rank{rank}.npz")
        for other in ("gluon", "plain"):
            want = np.load(tables_job / other / f"tables-rank{rank}.npz")
            for name in want.files:
                assert np.array_equal(got[name], want[name]), f"rank {rank} {name}: {other}"


def test_distributed_trainer_pushes_both_tables_rows_in_one_meeting(tables_job):
    # after the first step (which decides the routes and pulls plainly), a step's pushes of
    # rows meet no one on the caller's thread (each carries its agreement in its gather, on
    # the communication thread); gluon.Trainer pushes the tables one by one, a gather each,
    # DistributedTrainer both in one call, one gather
    for rank in range(4):
        steps = {}
        for name in ("fused", "gluon"):
            seen = json.load(open(tables_job / name / f"tables-stats-rank{rank}.json"))
            after = seen["meetings_after_step"]
            assert [b - a for a, b in zip(after, after[1:])] == [0] * (STEPS - 1), \
                (name, rank, after)
            gathers = seen["gathers_after_step"]
            steps[name] = [b - a for a, b in zip(gathers, gathers[1:])]
        assert steps == {"fused": [1] * (STEPS - 1), "gluon": [2] * (STEPS - 1)}, (rank, steps)


@pytest.fixture(scope="module")
def host_tables_job(tmp_path_factory):
    """The two tables with rows aggregated per host (2 emulated hosts of 2 ranks, a server
    each, --row-masters host), rows prefetched: through DistributedTrainer (both tables in one
    push) and through gluon.Trainer (a push per table)."""
    out = tmp_path_factory.mktemp("host-tables")
    for name, fused in (("fused", "1"), ("gluon", "0")):
        (out / name).mkdir()
        r = run_launcher(["-n", 4, "--clients", 1, "--servers", 2, "--row-masters", "host"],
                         "train_sparse.py", [out / name, 1, STEPS, PER_DEVICE, "tables"],
                         timeout=240, env={"KVHYBRID_EMULATE_NODE_SIZE": "2",
                                           "KVHYBRID_TEST_FUSED": fused,
                                           "KVHYBRID_TEST_PREFETCH": "1"})
        assert r.returncode == 0, r.output[-4000:]
    return out


def test_host_masters_push_both_tables_rows_in_one_gather_and_train_like_one_process(
        host_tables_job):
    # a host's master sees only its host's calls, so the group agrees on the push first, on
    # the communication thread (no meeting on the callers' threads); then both tables' rows
    # and next ids go to the host's master in one gather there (gluon.Trainer's push per
    # table: an agreement and a gather each)
    assert_matches_single_process(host_tables_job / "fused", "tables", 4, 1)
    for rank in range(4):
        got = np.load(host_tables_job / "fused" / f"tables-rank{rank}.npz")
        want = np.load(host_tables_job / "gluon" / f"tables-rank{rank}.npz")
        for name in want.files:
            assert np.array_equal(got[name], want[name]), f"rank {rank} {name}"
        steps = {}
        for name, meetings in (("fused", 0), ("gluon", 0)):   # (the callers' meetings)
            seen = json.load(open(host_tables_job / name / f"tables-stats-rank{rank}.json"))
            after = seen["meetings_after_step"]
            assert [b - a for a, b in zip(after, after[1:])] == [meetings] * (STEPS - 1), \
                (name, rank, after)
            gathers = seen["gathers_after_step"]
            steps[name] = [b - a for a, b in zip(gathers, gathers[1:])]
        # the gathers of rows, on the communication thread: one a step for both tables
        assert steps == {"fused": [1] * (STEPS - 1), "gluon": [2] * (STEPS - 1)}, (rank, steps)


def test_a_pull_of_prefetched_rows_waits_in_the_engine_not_on_the_callers_thread(tmp_path):
    """In a loop that never waits, the pull of the handed ids returns before the hand-out
    that brings its rows has run: the master holds its push until rank 1 has written, after
    its pull returned, that it did; the rows rank 1 then reads are the servers' update of
    both pushes. A wrong push that rank 1's pull did not wait for leaves zeros in its out,
    and every rank raises the push's error at its next call."""
    r = run_launcher(["-n", 2, "--servers", 1], "prefetch_no_wait.py", [tmp_path], timeout=180)
    assert r.returncode == 0, r.output[-3000:]
    got = [json.load(open(tmp_path / f"no-wait-rank{rank}.json")) for rank in range(2)]
    # an order, read from a file (the pull used to wait for the hand-out, hence the master)
    assert got[0]["pull_returned_first"] and got[0]["wrong_pull_returned_first"], got
    for g in got:
        assert g["pulled"] == [-3, -3, 1] and g["full_path"] == 1, g
        assert g["raised"] == "KeyValueError", g
        assert g["message"].startswith("push failed on rank 1: key 'w' holds a sparse "
                                       "weight"), g
    assert got[1]["wrong_pulled"] == [0, 0, 0], got[1]
