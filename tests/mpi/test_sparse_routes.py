"""Routing row_sparse keys by α (Parallax §3.1): forced and measured routes, and the result
still equals single-process training.

The embedding of the sparse_grad model (Gluon's key 4) goes "dense" — forced by KVHYBRID_ROUTES, or
chosen because KVHYBRID_AR_EFFICIENCY makes allreduce bytes cheap enough — and its
gradient is then summed whole: the reference updates every row (lazy_update=False).
"""
import ast
import re

import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon

from tests.support.jobs import run_job, run_launcher
from tests.mpi.workers.sparse_models import make_sparse_net, make_trainer, set_weights, sparse_batch, trained_weights

STEPS, PER_DEVICE = 4, 5
EMBED = "bagofwords0_embedding0_weight"
SPARSE_EMBED = "bagofwords0_sparseembedding0_weight"
CASES = {  # name: (workers, client groups, servers, environment, expected route of the embedding)
    "forced-dense-pure-mpi": (2, 1, 0, {"KVHYBRID_ROUTES": "4=dense"}, "dense"),
    "forced-dense-by-name-1server": (4, 1, 1, {"KVHYBRID_ROUTES": f"{EMBED}=dense"}, "dense"),
    # a SparseEmbedding's table lives on the server until the route takes it back
    "forced-dense-sparse-weight-1server": (4, 1, 1, {"KVHYBRID_ROUTES": f"{SPARSE_EMBED}=dense"},
                                           "dense"),
    "measured-rows-pure-mpi": (4, 1, 0, {}, "rows"),
    "measured-dense-cheap-allreduce": (4, 1, 0, {"KVHYBRID_AR_EFFICIENCY": "100"}, "dense"),
}


def run(tmp_path, workers, clients, servers, env, kind):
    args = [tmp_path, 1, STEPS, PER_DEVICE, kind]
    if servers == 0:
        r = run_job(workers, "train_sparse.py", args, timeout=240, env=env)
    else:
        r = run_launcher(["-n", workers, "--clients", clients, "--servers", servers],
                         "train_sparse.py", args, timeout=240, env=env)
    assert r.returncode == 0, r.output[-4000:]
    return r.output


def reference(init, workers, lazy):
    net = make_sparse_net("grad")
    net.initialize(ctx=mx.cpu())
    set_weights(net, init)
    trainer, step_arg = make_trainer(net, "grad", None, PER_DEVICE, lazy=lazy)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        x, y = sparse_batch(step, workers * PER_DEVICE)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(step_arg)
    return trained_weights(net)


@pytest.mark.parametrize("case", list(CASES))
def test_route_is_taken_and_training_matches_single_process(tmp_path, case):
    workers, clients, servers, env, route = CASES[case]
    kind = "weight" if SPARSE_EMBED in env.get("KVHYBRID_ROUTES", "") else "grad"
    output = run(tmp_path, workers, clients, servers, env, kind)
    stats = [ast.literal_eval(m) for m in re.findall(r"key stats (\{.*?\}\})", output)]
    assert len(stats) == workers, output[-3000:]
    for s in stats:
        (embed,) = s.values()   # the only row_sparse key
        assert embed["name"] == (EMBED if kind == "grad" else SPARSE_EMBED), s
        assert embed["route"] == route, s
        assert embed["pushes"] == STEPS and 0 < embed["alpha"] < 0.2, s  # ~20 of 1000 rows
    # densified, a SparseEmbedding trains as a dense table: the nn.Embedding reference
    init = dict(np.load(tmp_path / f"{kind}-init.npz"))
    ref = reference(init, workers, lazy=route != "dense")
    for rank in range(workers):
        got = np.load(tmp_path / f"{kind}-rank{rank}.npz")
        for name, want in ref.items():
            err = np.linalg.norm(got[name] - want) / np.linalg.norm(want)
            assert err <= 1e-5, f"rank {rank} {name}: relative error {err:.2e}"


def test_dense_and_lazy_references_differ():
    """The check above can tell the routes apart: updating every row is another result."""
    init_net = make_sparse_net("grad")
    init_net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    init = {k: v.data().asnumpy() for k, v in init_net._collect_params_with_prefix().items()}
    lazy, full = reference(init, 2, True), reference(init, 2, False)
    diff = max(np.linalg.norm(lazy[k] - full[k]) / np.linalg.norm(full[k]) for k in full)
    assert diff > 1e-4


@pytest.mark.parametrize("env, message", [
    ({"KVHYBRID_ROUTES": "nosuchkey=dense"}, "KVHYBRID_ROUTES names 'nosuchkey'"),
    ({"KVHYBRID_ROUTES": "4=servers"}, "its routes are 'rows' and 'dense'"),
])
def test_bad_forced_route_fails_on_every_rank_with_the_fix(tmp_path, env, message):
    r = run_job(2, "train_sparse.py", [tmp_path, 1, 1, PER_DEVICE, "grad"], timeout=240, env=env)
    assert r.returncode != 0
    assert r.output.count(message) >= 2, r.output[-3000:]
