"""Synchronous training through hybrid-mpi equals one process training on the union batch.

Real mpirun jobs of 2 and 4 ranks with 1 and 2 devices (mx.cpu(i)) per rank
train an MLP and a CNN with SGD + momentum + weight decay, for both
update_on_kvstore settings. Ranks start from different random weights, so the
store's broadcast has to make them equal before training. Shapes with client
groups and parameter servers run through kvhybrid-launch with real ps-lite
servers (the servers then apply the optimizer).
"""
import json
import os

import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon

from tests.mpi.workers.models import batch, make_net, make_optimizer, weights
from tests.support.jobs import run_job, run_launcher

STEPS, PER_DEVICE = 4, 3
# (workers, devices per worker, client groups, servers, trainer); "fused" is
# kvhybrid.DistributedTrainer, which sends a step's keys in one fused store call. Dense
# sums take the engine path (overlap.py) by default; "fused-blocking" the blocking one
# (KVHYBRID_ENGINE=0)
SHAPES = [(2, 1, 1, 0, "gluon"), (2, 2, 1, 0, "gluon"), (4, 1, 1, 0, "gluon"),
          (4, 2, 1, 0, "gluon"), (4, 1, 2, 2, "gluon"), (4, 2, 4, 2, "gluon"),
          (4, 1, 1, 1, "gluon"), (3, 2, 1, 0, "fused"), (3, 2, 1, 0, "fused-blocking"),
          (4, 1, 2, 1, "fused"), (2, 1, 2, 1, "fused"), (2, 2, 2, 1, "fused")]
# the model's keys are small, so auto sums them with MPI's call: these force the others
# (hierarchical over two emulated hosts of 2 ranks)
SHAPES += [(3, 1, 1, 0, "gluon", "ring"), (4, 1, 1, 0, "gluon", "shm"),
           (4, 2, 1, 0, "fused", "hierarchical")]


#: the four trainings (model:update_on_kvstore), as train_equivalence.py names them
COMBOS = ("mlp:0", "cnn:0", "mlp:1", "cnn:1")


def _stats(out, combo: str, rank: int) -> dict:
    """What one rank's dense sums ran in one training (the worker's stats file)."""
    model, uok = combo.split(":")
    with open(os.path.join(out, f"{model}-uok{uok}-rank{rank}-stats.json")) as f:
        return json.load(f)


def _id(s) -> str:
    return f"{s[0]}workers-{s[1]}dev-{s[2]}clients-{s[3]}servers-{s[4]}" + \
        (f"-{s[5]}" if len(s) > 5 else "")


@pytest.fixture(scope="module", params=SHAPES, ids=_id)
def job(request, tmp_path_factory):
    ranks, ndev, clients, servers, trainer = request.param[:5]
    algorithm = request.param[5] if len(request.param) > 5 else "auto"
    out = tmp_path_factory.mktemp(f"eq-{_id(request.param)}")
    args = [out, ndev, STEPS, PER_DEVICE]
    if servers == 0:
        env = {"KVHYBRID_ALLREDUCE": algorithm,
               "KVHYBRID_EMULATE_NODE_SIZE": "2" if algorithm == "hierarchical" else "0"}
        if trainer.startswith("fused"):
            env["KVHYBRID_TEST_FUSED"] = "1"
            env["KVHYBRID_ENGINE"] = "0" if trainer == "fused-blocking" else "1"
        result = run_job(ranks, "train_equivalence.py", args, timeout=300, env=env)
        assert result.returncode == 0, result.output[-4000:]
        stats = {(combo, rank): _stats(out, combo, rank) for combo in COMBOS
                 for rank in range(ranks)}
        if algorithm != "auto":  # the forced algorithm summed every dense key
            others = [a for a in ("mpi", "ring", "shm", "hierarchical") if a != algorithm]
            for c in (s["algorithms"] for s in stats.values()):
                assert c[algorithm] > 0 and not any(c[a] for a in others), c
        if trainer.startswith("fused"):   # one fused allreduce per step (and per training) on every rank
            assert all(s["fused"] == STEPS for s in stats.values()), stats
            # without an optimizer on the store, gradients are summed where backward wrote them
            assert all(s["in_place"] == STEPS for (combo, _), s in stats.items()
                       if combo.endswith(":0")), stats
    else:  # one store per process with servers: one job per training
        # "fused" with several groups: the small keys travel to the servers packed (packs.py);
        # with a group per worker, through MXNet's engine (server_round_trips.py), as do
        # gluon.Trainer's calls key by key
        env = {"KVHYBRID_TEST_FUSED": "1"} if trainer == "fused" else None
        for combo in COMBOS:
            result = run_launcher(["-n", ranks, "--clients", clients, "--servers", servers],
                                  "train_equivalence.py", args + [combo], timeout=300, env=env)
            assert result.returncode == 0, result.output[-4000:]
            trips = [_stats(out, combo, rank)["round_trips"] for rank in range(ranks)]
            if clients == ranks:   # every step's pushpull went that way (gluon.Trainer's:
                want = STEPS if trainer == "fused" else STEPS * 2   # one per key, several)
                assert all(int(t) >= want for t in trips), trips
            else:   # bigger groups sum first, then their masters meet on the servers
                assert all(int(t) == 0 for t in trips), trips
    return ranks, ndev, out


def reference(model: str, init: str, ranks: int, ndev: int) -> dict:
    """One process, one device, the union of every rank's and device's samples."""
    net = make_net(model)
    net.load_parameters(init, ctx=mx.cpu())
    name, params = make_optimizer()
    trainer = gluon.Trainer(net.collect_params(), name, params, kvstore=None)
    total = ranks * ndev * PER_DEVICE
    # step(batch) with the per-worker batch: dist_sync semantics (gradients are summed).
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        x, y = batch(model, step, total)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(ndev * PER_DEVICE)
    return weights(net)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


@pytest.mark.parametrize("update_on_kvstore", [True, False], ids=["uok", "no-uok"])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_matches_single_process_on_union_batch(job, model, update_on_kvstore):
    ranks, ndev, out = job
    tag = f"{model}-uok{int(update_on_kvstore)}"
    ref = reference(model, os.path.join(out, f"{tag}-init.params"), ranks, ndev)
    init = mx.nd.load(os.path.join(out, f"{tag}-init.params"))
    moved = 0.0
    for rank in range(ranks):
        got = np.load(os.path.join(out, f"{tag}-rank{rank}.npz"))
        assert sorted(got.files) == sorted(ref), "the distributed and reference nets differ"
        for name, want in ref.items():
            err = rel_err(got[name], want)
            assert err <= 1e-5, f"rank {rank} {name}: relative error {err:.2e} > 1e-5"
        moved = max(moved, max(rel_err(ref[n], init[n].asnumpy()) for n in ref))
    assert moved > 1e-3, "training did not change the weights: the comparison would prove nothing"
