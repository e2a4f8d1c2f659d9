"""MXNet's Module API through hybrid-mpi, as MXNet's sparse examples train:
examples/train_sparse_module.py (CSR batches, a row_sparse weight, ``prepare`` with the
batch's ids, update on the store, a pull of every row for eval and each checkpoint) equals
one process training on the union of the ranks' batches, for SGD (momentum, weight decay),
Adam (weight decay) and AdaGrad, in each of the launcher's shapes. Real jobs with real
ps-lite servers."""
import importlib.util
import json

import numpy as np
import mxnet as mx
import pytest

from tests.support.jobs import ROOT, run_launcher

EXAMPLE = ROOT / "examples" / "train_sparse_module.py"
FEATURES, NNZ, BATCH, BATCHES, EPOCHS, LR = 20_000, 12, 64, 3, 2, 0.1
#: (workers, client groups, servers)
SHAPES = {"pure-mpi": (2, 1, 0), "1group-1server": (2, 1, 1),
          "2groups-1server": (4, 2, 1), "group-per-worker": (2, 2, 1)}


def _example():
    spec = importlib.util.spec_from_file_location("train_sparse_module", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(example, init: dict, workers: int, optimizer: str) -> dict:
    """One process, one Module, no store: step s trains on every rank's s-th batch at once."""
    samples = example.dataset(BATCH * BATCHES * workers, FEATURES, NNZ, seed=1)
    parts = [example.part(samples, r, workers, FEATURES, BATCH) for r in range(workers)]
    rows = np.concatenate([np.concatenate([p._rows[s * BATCH:(s + 1) * BATCH] for p in parts])
                           for s in range(BATCHES)])
    union = example.CSRBatches(*samples, rows, FEATURES, BATCH * workers)
    mod = mx.mod.Module(example.linear_model(FEATURES, 2), data_names=["data"],
                        label_names=["softmax_label"])
    mod.bind(data_shapes=union.provide_data, label_shapes=union.provide_label)
    mod.set_params(init, {})
    mod.init_optimizer(kvstore=None, optimizer=optimizer,
                       optimizer_params=example.optimizer_params(optimizer, LR))
    for _ in range(EPOCHS):
        union.reset()
        for batch in union:
            mod.forward_backward(batch)
            mod.update()
    return {k: v.tostype("default").asnumpy() for k, v in mod.get_params()[0].items()}


def _params(path) -> dict:
    return {k[4:]: v for k, v in mx.nd.load(str(path)).items() if k.startswith("arg:")}


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_module_over_csr_equals_one_process_on_the_union_batch(shape, optimizer, tmp_path):
    workers, clients, servers = SHAPES[shape]
    prefix = tmp_path / "model"
    r = run_launcher(["-n", workers, "--clients", clients, "--servers", servers], str(EXAMPLE),
                     ["--features", FEATURES, "--nnz", NNZ, "--batch-size", BATCH,
                      "--batches", BATCHES, "--epochs", EPOCHS, "--optimizer", optimizer,
                      "--lr", LR, "--prefix", prefix], timeout=180)
    assert r.returncode == 0, r.output[-4000:]
    assert f"epoch {EPOCHS}: train accuracy" in r.output, r.output[-3000:]
    init = _params(f"{prefix}-0000.params")
    want = reference(_example(), init, workers, optimizer)
    got = _params(f"{prefix}-{EPOCHS:04d}.params")
    for name, value in want.items():
        have = got[name].tostype("default").asnumpy()
        assert np.allclose(have, value, rtol=1e-5, atol=1e-6), \
            (name, float(np.abs(have - value).max()))
        assert np.abs(value - init[name].tostype("default").asnumpy()).max() > 1e-3, \
            f"{name} did not move: the comparison would prove nothing"


def test_a_module_whose_store_is_dropped_unclosed_serves_its_last_pull_and_exits_cleanly(
        tmp_path):
    """The example's ``main`` returns with its Module and store dropped, collected as garbage,
    and its last checkpoint's pull of every row possibly still on the communication thread
    (without ``--prefix`` nothing waits for it): the store is still closed at exit, which
    serves that pull and writes the row_sparse keys' stats, and the job ends well."""
    stats = tmp_path / "stats.json"
    r = run_launcher(["-n", 2, "--servers", 1], "module_dropped.py",
                     ["--features", FEATURES, "--nnz", NNZ, "--batch-size", BATCH,
                      "--batches", BATCHES, "--epochs", EPOCHS], timeout=180,
                     env={"KVHYBRID_STATS_FILE": str(stats)})
    assert r.returncode == 0, r.output[-4000:]
    assert stats.exists(), f"the store was never closed: no stats file\n{r.output[-3000:]}"
    assert "weight" in json.load(open(stats))["keys"], stats.read_text()
