"""Create a hybrid-mpi store and print its identity."""
import mxnet as mx

import kvhybrid  # noqa: F401

kv = mx.kv.create("hybrid-mpi")
print(f"store rank={kv.rank} num_workers={kv.num_workers} type={kv.type}", flush=True)
kv.close()
