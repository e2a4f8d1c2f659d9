"""Row-sparse gradients (nn.Embedding(sparse_grad=True)) over pure MPI equal single-process training.

MXNet's own dist_sync crashes its servers on this model (MXNet issues #19949, #21118);
hybrid-mpi gathers only the touched rows with Allgatherv and applies the same lazy
update on every rank.
"""
import json

import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon

from models import weights
from mpirun import run_job, run_launcher
from sparse_models import make_sparse_net, sparse_batch

STEPS, PER_DEVICE = 4, 5


@pytest.mark.parametrize("ranks,ndev", [(2, 1), (4, 2)], ids=["2ranks-1dev", "4ranks-2dev"])
def test_sparse_gradients_match_single_process(tmp_path, ranks, ndev):
    r = run_job(ranks, "train_sparse.py", [tmp_path, ndev, STEPS, PER_DEVICE], timeout=240)
    assert r.returncode == 0, r.output[-4000:]
    # One process, one device, the union batch; step(per-worker batch): dist_sync semantics.
    total = ranks * ndev * PER_DEVICE
    net = make_sparse_net()
    net.load_parameters(str(tmp_path / "init.params"), ctx=mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.5, "momentum": 0.9, "wd": 1e-3}, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        x, y = sparse_batch(step, total)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(ndev * PER_DEVICE)
    ref = weights(net)
    init = mx.nd.load(str(tmp_path / "init.params"))
    for rank in range(ranks):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for name, want in ref.items():
            err = np.linalg.norm(got[name] - want) / np.linalg.norm(want)
            assert err <= 1e-5, f"rank {rank} {name}: relative error {err:.2e}"
    moved = np.linalg.norm(ref["embed.weight"] - init["embed.weight"].asnumpy())
    assert moved > 1e-3, "the embedding did not train: the comparison would prove nothing"


@pytest.mark.parametrize("touched", [0.01, 0.10])
def test_row_sparse_traffic_scales_with_rows_touched(tmp_path, touched):
    # A 1M-row table: each rank pushes gradients for a fraction of its rows.
    r = run_job(2, "sparse_traffic.py", [tmp_path / "traffic.json", touched], timeout=240)
    assert r.returncode == 0, r.output[-4000:]
    sent = json.load(open(tmp_path / "traffic.json"))
    fraction = sent["bytes_sent"] / sent["table_bytes"]
    # ids (8 bytes) travel with each row (32 bytes): 1.25x the rows' share of the table
    assert touched <= fraction <= 1.5 * touched, f"sent {fraction:.2%} of the table's bytes"
    assert sent["stored_rows_nonzero"] == sent["union_rows"]     # the sum landed in the store


def test_sparse_weights_are_refused_on_every_rank_with_a_clear_error():
    r = run_job(2, "sparse_weight.py", timeout=120)
    assert r.returncode != 0
    for rank in range(2):
        assert f"rank {rank} raised:" in r.output, r.output[-3000:]
    assert "sparse weights (contrib.nn.SparseEmbedding) are not supported yet" in r.output


def test_sparse_gradients_with_servers_are_refused_with_a_clear_error(tmp_path):
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "train_sparse.py",
                     [tmp_path, 1, 1, 2], timeout=120)
    assert r.returncode != 0
    assert "row_sparse gradients go through MPI only without parameter servers so far" in r.output
