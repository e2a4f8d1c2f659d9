"""Train MLP and CNN through hybrid-mpi, for both update_on_kvstore settings; dump weights.

argv: OUT_DIR DEVICES_PER_RANK STEPS PER_DEVICE_BATCH [COMBOS]
COMBOS: which trainings, e.g. "mlp:1,cnn:0" (model:update_on_kvstore); default all four.
With parameter servers a process holds one store, so such jobs run one combo each.
KVHYBRID_TEST_FUSED=1 trains with kvhybrid.DistributedTrainer (fused store calls).
Every rank writes OUT_DIR/<model>-uok<0|1>-rank<r>.npz, and what its dense sums ran
(``dense_stats``) to <model>-uok<0|1>-rank<r>-stats.json; rank 0 also writes the initial
weights it started from (<model>-init.params) for the reference run.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import gluon

sys.path.insert(0, os.path.dirname(__file__))
import kvhybrid  # noqa: E402,F401  registers 'hybrid-mpi'
from models import make_net, make_optimizer, sample_input, train_steps, weights  # noqa: E402

out_dir, ndev, steps, per_device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
combos = sys.argv[5] if len(sys.argv) > 5 else "mlp:0,cnn:0,mlp:1,cnn:1"
ctxs = [mx.cpu(i) for i in range(ndev)]

for combo in combos.split(","):
    model, uok = combo.split(":")[0], bool(int(combo.split(":")[1]))
    kv = mx.kv.create("hybrid-mpi")
    rank, size = kv.rank, kv.num_workers
    mx.random.seed(100 + rank)  # different initial weights per rank: broadcast_parameters fixes it
    net = make_net(model)
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net(sample_input(model).as_in_context(ctxs[0]))  # finish deferred initialisation
    kvhybrid.broadcast_parameters(net.collect_params(), kv)
    if rank == 0:
        net.save_parameters(os.path.join(out_dir, f"{model}-uok{int(uok)}-init.params"))
    name, params = make_optimizer()
    make_trainer = kvhybrid.DistributedTrainer if os.environ.get("KVHYBRID_TEST_FUSED") \
        else gluon.Trainer   # the fused path: one store call per step
    trainer = make_trainer(net.collect_params(), name, params, kvstore=kv, update_on_kvstore=uok)
    loss = train_steps(net, trainer, model, steps, per_device, ctxs,
                       offset=rank * ndev * per_device, total=size * ndev * per_device)
    assert trainer._update_on_kvstore == uok, trainer._update_on_kvstore
    np.savez(os.path.join(out_dir, f"{model}-uok{int(uok)}-rank{rank}.npz"), **weights(net))
    stats = kv.dense_stats()
    with open(os.path.join(out_dir, f"{model}-uok{int(uok)}-rank{rank}-stats.json"), "w") as f:
        json.dump(stats, f)
    print(f"rank {rank} {model} update_on_kvstore={uok} loss {loss:.4f} "
          f"fused allreduces {stats['fused']} in place {stats['in_place']} "
          f"round trips on the engine {stats['round_trips']} "
          f"calls by algorithm {stats['algorithms']}", flush=True)
    kv.close()
