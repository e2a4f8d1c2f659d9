"""MXNet's Module over CSR batches (examples/train_sparse_module.py's model) where the ranks
have different numbers of batches: rank 0 one more than the others, as
``mx.io.LibSVMIter(num_parts=...)`` can split a file. After its batches each rank scores
(a pull of every row) and saves its weights (another).

    uneven_batches.py BATCHES     (rank 0 runs BATCHES + 1)
"""
import importlib.util
import pathlib
import sys

import mxnet as mx

import kvhybrid  # noqa: F401

spec = importlib.util.spec_from_file_location(
    "train_sparse_module",
    pathlib.Path(__file__).resolve().parents[3] / "examples" / "train_sparse_module.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

FEATURES, BATCH = 10_000, 32
batches = int(sys.argv[1])
kv = mx.kv.create("hybrid-mpi")
mine = batches + (1 if kv.rank == 0 else 0)
samples = example.dataset(BATCH * (batches + 1) * kv.num_workers, FEATURES, 8, seed=1)
train = example.part(samples, kv.rank, kv.num_workers, FEATURES, BATCH)
mod = mx.mod.Module(example.linear_model(FEATURES, 2), data_names=["data"],
                    label_names=["softmax_label"])
mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
mod.init_params()
mod.init_optimizer(kvstore=kv, optimizer="sgd", optimizer_params={"learning_rate": 0.1})
for _, data_batch in zip(range(mine), train):
    mod.prepare(data_batch, sparse_row_id_fn=example.batch_row_ids)
    mod.forward_backward(data_batch)
    mod.update()
all_rows = mx.nd.arange(0, FEATURES, dtype="int64")
mod.prepare(None, lambda _: {"weight": all_rows})
train.reset()
mod.score(train, "acc", num_batch=1)
mod.get_params()
print(f"rank {kv.rank} finished", flush=True)
