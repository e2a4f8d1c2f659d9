"""Create a hybrid-mpi store (argv[1]: another of kvhybrid's store names) and print its
identity."""
import sys

import mxnet as mx

import kvhybrid  # noqa: F401

kv = mx.kv.create(sys.argv[1] if len(sys.argv) > 1 else "hybrid-mpi")
print(f"store rank={kv.rank} num_workers={kv.num_workers} type={kv.type}", flush=True)
kv.close()
