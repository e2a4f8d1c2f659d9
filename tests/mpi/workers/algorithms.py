"""Every allreduce algorithm against numpy's sum, for dtypes, sizes and devices per rank.

argv: OUT_JSON. Small shared-memory chunks and ring segments make a few-KB array span
many of them; a last round uses the real sizes on a 3 MB array. The auto selector's
choices are recorded too.
"""
import json
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401  registers hybrid-mpi
from kvhybrid.tensor_collectives import allreduce, ring, shared_memory
from kvhybrid.tensor_collectives.algorithms import (ALGORITHMS, CROSS_HOST_BYTES, SMALL_BYTES,
                                                      TRIALS)
from kvhybrid.tensor_collectives.ndarray_view import host_view

kv = mx.kv.create("hybrid-mpi")
group, rank, size = kv.group, kv.rank, kv.num_workers
algos = group.algorithms
topo = algos.topology
results = {"topology": {"nodes": topo.nodes, "uniform": topo.uniform, "node_size": topo.node.size}}


def data(n, dtype, r, dev=0):
    rng = np.random.RandomState(1000 * r + 10 * dev + n % 997)
    return rng.standard_normal(n).astype(dtype)


def expected(n, dtype, ndev=1):
    return sum(data(n, dtype, r, d).astype(np.float64) for r in range(size) for d in range(ndev))


def check(name, got, want, dtype):
    tol = 2e-2 if dtype == "float16" else 1e-5
    err = float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(1, np.abs(want)))) \
        if want.size else 0.0
    results[name] = {"err": err, "ok": bool(err <= tol and got.shape == want.shape)}


def runnable(name):
    return not ((name == "shm" and topo.nodes > 1) or (name == "hierarchical" and not topo.uniform))


def identical_everywhere(arr):
    """Every rank holds the same bits (replicas must not drift apart)."""
    mine = np.frombuffer(arr.tobytes(), dtype=np.uint8)
    first = mine.copy()
    group.comm.Bcast(first, root=0)
    return bool(group.comm.allreduce(int(np.array_equal(mine, first)), op=group.MPI.MIN))


REAL_SIZES = ring.MIN_SEGMENT_BYTES, ring.MAX_SEGMENT_BYTES, shared_memory.CHUNK_BYTES
ring.MIN_SEGMENT_BYTES = ring.MAX_SEGMENT_BYTES = 1024   # many segments per chunk
shared_memory.CHUNK_BYTES = 4096    # many chunks per array
SIZES = [0, 1, 7, size * 3 + 1, 5003, 100003]
for name in ALGORITHMS:
    if not runnable(name):
        continue
    algos.forced = name
    for dtype in ("float16", "float32", "float64"):
        for n in SIZES:
            for ndev in (1, 2):
                arrays = [mx.nd.array(data(n, dtype, rank, d), ctx=mx.cpu(d), dtype=dtype)
                          for d in range(ndev)]
                allreduce(arrays, group=group)
                want = expected(n, dtype, ndev)
                for d, a in enumerate(arrays):
                    check(f"{name}-{dtype}-n{n}-dev{ndev}-copy{d}", a.asnumpy(), want, dtype)
                results[f"{name}-{dtype}-n{n}-dev{ndev}-identical"] = {
                    "err": 0, "ok": identical_everywhere(arrays[0].asnumpy())}
    # straight on a host view, as the fused path calls it
    v = data(4099, "float32", rank)
    algos.run(name, v)
    check(f"{name}-view", v, expected(4099, "float32"), "float32")

# the same sums with waits that sleep between tests (the engine's communication thread)
algos.patient = True
for name in ALGORITHMS:
    if not runnable(name):
        continue
    algos.forced = name
    for n in (size * 3 + 1, 100003):
        v = data(n, "float32", rank)
        algos.run(name, v)
        check(f"{name}-patient-n{n}", v, expected(n, "float32"), "float32")
        results[f"{name}-patient-n{n}-identical"] = {"err": 0, "ok": identical_everywhere(v)}
# small sums of a patient group on one host: made in the host barrier's meeting
algos.forced = "auto"
results["meeting-used"] = []
# (the last two 100-800 KB: up to meeting_sum.capacity)
for n in (size * 3 + 1, 5003, 30001, 5003, 100003, 50001):
    for dtype in ("float16", "float32", "float64"):
        v = data(n, dtype, rank)
        results["meeting-used"].append(algos.allreduce(v))
        check(f"meeting-{dtype}-n{n}", v, expected(n, dtype), dtype)
        results[f"meeting-{dtype}-n{n}-identical"] = {"err": 0, "ok": identical_everywhere(v)}
algos.patient = False

# the real chunk and segment sizes, on an array spanning several chunks
ring.MIN_SEGMENT_BYTES, ring.MAX_SEGMENT_BYTES, shared_memory.CHUNK_BYTES = REAL_SIZES
algos._shm = None   # rebuilt with the real chunk size (collective, same point on every rank)
n = 3 * 2**20 // 4 + 5
for name in ALGORITHMS:
    if runnable(name):
        algos.forced = name
        a = mx.nd.array(data(n, "float32", rank))
        allreduce(a, group=group)
        check(f"{name}-large", a.asnumpy(), expected(n, "float32"), "float32")

# what auto picks: MPI's call for small sums; for large ones every candidate, TRIALS times
# each, then the one the ranks settled on. The store's pushpull sums on the engine path's
# own group (its communication thread) when it has one.
if kv.engine is not None:
    algos = kv.engine.group.algorithms
algos.forced = "auto"
results["auto-small"] = algos.select(SMALL_BYTES // 2)
results["auto-small-measured"] = algos.measured(SMALL_BYTES // 2)
results["auto-tiny-measured"] = algos.measured(CROSS_HOST_BYTES // 2)
results["auto-max"] = algos.select(64 * 2**20, "max")
results["candidates"] = algos.candidates()
n = 2**20
kv.init("big", mx.nd.zeros((n,)))
used = []
for step in range(TRIALS * len(algos.candidates()) + 2):
    before = dict(algos.calls)
    a = mx.nd.array(data(n, "float32", rank))
    kv.pushpull("big", a)
    check(f"auto-pushpull-{step}", a.asnumpy(), expected(n, "float32"), "float32")
    used += [k for k in ALGORITHMS if algos.calls[k] > before[k]]
results["auto-used"] = used
results["auto-chosen"] = algos.chosen.get((n * 4).bit_length())
results["auto-chosen-everywhere"] = group.comm.allgather(results["auto-chosen"])
del host_view

if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)
kv.close()
