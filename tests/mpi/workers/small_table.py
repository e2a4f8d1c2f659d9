"""init of a 10-row row_sparse table: with KVHYBRID_PARTITIONS too large for the servers,
every rank must raise the same error before anything reaches them."""
import mxnet as mx

import kvhybrid  # noqa: F401

kv = mx.kv.create("hybrid-mpi")
try:
    kv.init("table", mx.nd.ones((10, 2)).tostype("row_sparse"))
except kvhybrid.KeyValueError as exc:
    print(f"rank {kv.rank} refused: {exc}", flush=True)
    raise SystemExit(3)
