"""allreduce / broadcast of NDArray tensors against numpy, for many dtypes and sizes, and the
master's row exchange (a packed gather and a packed message to each rank).

argv: OUT_JSON. Each case: every rank builds rank-specific data, runs the
collective, and records the max error against numpy's result.
"""
import dataclasses
import json
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401  registers hybrid-mpi
from kvhybrid.tensor_collectives import allreduce, broadcast, fusion, ops
from kvhybrid.tensor_collectives.rows import gather_patiently, pack_messages, scatter_bytes

kv = mx.kv.create("hybrid-mpi")
group, rank, size = kv.group, kv.rank, kv.num_workers
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
SIZES = [0, 1, 7, size * 3 + 1, 100003]
results = {}


def data(n, dtype, r, dev=0):
    rng = np.random.RandomState(1000 * r + 10 * dev + n % 997)
    hi = 3 if dtype == "uint8" else 50
    return (rng.randint(0, hi, size=n) if "int" in dtype else rng.standard_normal(n)).astype(dtype)


def check(name, got, want, dtype):
    tol = 1e-2 if dtype == "float16" else 1e-6
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)) /
                       np.maximum(1, np.abs(want.astype(np.float64))))) if want.size else 0.0
    results[name] = {"err": err, "ok": bool(err <= tol and got.shape == want.shape)}


# Fused pushpull: one call with many keys of mixed dtypes and sizes; a 4 KB threshold makes
# several buckets, and the 100003-element keys buckets of their own.
fused = kvhybrid.HybridMPIStore(dataclasses.replace(kv.config, fusion_threshold=4096))
real_is_host = fusion.ndarray_view.is_host
for staged in (False, True):
    # staged: the arrays are taken for accelerator ones (packed by the engine into pinned memory)
    fusion.ndarray_view.is_host = (lambda arr: False) if staged else real_is_host
    where = "staged" if staged else "host"
    for ndev in (1, 2):
        cases = [(dtype, n) for dtype in ("float16", "float32", "float64", "int32") for n in SIZES]
        keys = [f"fused-{where}-{i}-{dtype}-n{n}-dev{ndev}" for i, (dtype, n) in enumerate(cases)]
        fused.init(keys, [mx.nd.array(np.zeros(n, dtype), dtype=dtype) for dtype, n in cases])
        for in_place in (False, True):
            values = [[mx.nd.array(data(n, dtype, rank, d), ctx=mx.cpu(d), dtype=dtype)
                       for d in range(ndev)] for dtype, n in cases]
            outs = [[mx.nd.array(np.zeros(n, dtype), ctx=mx.cpu(d), dtype=dtype)
                     for d in range(ndev)] for dtype, n in cases]
            calls = fused.dense_stats()["fused"]
            fused.pushpull(keys, values, out=None if in_place else outs)
            ran = fused.dense_stats()["fused"] - calls
            results[f"fused-buckets-{where}-dev{ndev}-inplace{int(in_place)}"] = {
                "err": ran, "ok": 4 < ran < len(keys)}
            for (dtype, n), key, got in zip(cases, keys, values if in_place else outs):
                want = sum(data(n, dtype, r, d).astype(np.float64)
                           for r in range(size) for d in range(ndev)).astype(dtype)
                for d, a in enumerate(got):
                    check(f"{key}-inplace{int(in_place)}-copy{d}", a.asnumpy(), want, dtype)
fusion.ndarray_view.is_host = real_is_host
fused.close()

for staged in (False, True):
    if staged:  # take the accelerator path (pinned host staging) for CPU arrays too
        ops.is_host = lambda arr: False
    for dtype in DTYPES:
        for n in SIZES:
            for ndev in (1, 2):
                tag = f"{'staged' if staged else 'direct'}-{dtype}-n{n}-dev{ndev}"
                arrays = [mx.nd.array(data(n, dtype, rank, d), ctx=mx.cpu(d), dtype=dtype)
                          for d in range(ndev)]
                want = sum(data(n, dtype, r, d).astype(np.float64)
                           for r in range(size) for d in range(ndev)).astype(dtype)
                allreduce(arrays, group=group)
                for d, a in enumerate(arrays):
                    check(f"allreduce-{tag}-copy{d}", a.asnumpy(), want, dtype)
                src = size - 1
                arrays = [mx.nd.array(data(n, dtype, rank, d), ctx=mx.cpu(d), dtype=dtype)
                          for d in range(ndev)]
                broadcast(arrays, src=src, group=group)
                for d, a in enumerate(arrays):
                    check(f"broadcast-{tag}-copy{d}", a.asnumpy(), data(n, dtype, src, 0), dtype)
    for op, fn in (("max", np.maximum), ("min", np.minimum)):
        a = mx.nd.array(data(9, "float32", rank))
        want = data(9, "float32", 0)
        for r in range(1, size):
            want = fn(want, data(9, "float32", r))
        allreduce(a, op=op, group=group)
        check(f"allreduce-{op}-{'staged' if staged else 'direct'}", a.asnumpy(), want, "float32")

# The master's row exchange (rows.py): each rank's arrays of mixed dtypes and row shapes in one
# packed gather, the lengths differing by rank (rank 1's second array empty); and one packed
# message from the master to each rank, of a length of its own.


def rank_arrays(r):
    lengths = [3 * r + 1, 0 if r == 1 else r + 2, 5]
    rng = np.random.RandomState(77 + r)
    return [rng.randint(0, 10**6, size=lengths[0]).astype(np.int64),
            rng.standard_normal((lengths[1], 3, 2)).astype(np.float16),
            rng.standard_normal((lengths[2], 4)).astype(np.float32)]


def message(r):   # a list of arrays, sent as their bytes one after another
    return [np.arange(r, dtype=np.int64), rank_arrays(r)[1]]


def message_bytes(r):
    return np.concatenate([a.reshape(-1).view(np.uint8) for a in message(r)])


gathered = gather_patiently(rank_arrays(rank), group, root=0, name="the test's rows")
got = scatter_bytes(pack_messages([message(r) for r in range(size)]) if rank == 0 else None,
                    np.empty(len(message_bytes(rank)), np.uint8), group,
                    name="the test's messages")
mine = {"scatter": bool(got.dtype == np.uint8 and np.array_equal(got, message_bytes(rank))),
        "gather_elsewhere_none": rank == 0 or gathered is None}
everyone = group.comm.gather(mine, root=0)
if rank == 0:
    for i in range(3):
        whole, counts = gathered[i]
        parts = [rank_arrays(r)[i] for r in range(size)]
        want = np.concatenate(parts)
        ok = (whole.dtype == want.dtype and whole.shape == want.shape
              and np.array_equal(whole, want) and list(counts) == [len(p) for p in parts])
        results[f"rows-gather-position{i}"] = {"err": 0.0 if ok else 1.0, "ok": bool(ok)}
    for what in ("scatter", "gather_elsewhere_none"):
        ok = all(m[what] for m in everyone)
        results[f"rows-{what}"] = {"err": 0.0 if ok else 1.0, "ok": ok}

if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)
kv.close()
