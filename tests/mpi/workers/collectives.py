"""allreduce / broadcast of NDArray tensors against numpy, for many dtypes and sizes, and the
master's row exchange (a packed gather and a packed message to each rank), in the host's
shared memory and by MPI.

argv: OUT_JSON. Each case: every rank builds rank-specific data, runs the
collective, and records the max error against numpy's result.
"""
import dataclasses
import json
import sys
from typing import Sequence, Tuple

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401  registers hybrid-mpi
from kvhybrid.tensor_collectives import allreduce, broadcast, fusion, ops
from kvhybrid.tensor_collectives.rows import gather_patiently, scatter_bytes

kv = mx.kv.create("hybrid-mpi")
group, rank, size = kv.group, kv.rank, kv.num_workers
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
SIZES = [0, 1, 7, size * 3 + 1, 100003]
results = {}


def pack_messages(messages: Sequence[Sequence[np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """``scatter_bytes``'s send side: (bytes, each rank's byte count), where rank r's bytes
    are ``messages[r]``'s arrays (any dtypes and shapes) one after another."""
    pieces = [[np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in m] for m in messages]
    sizes = np.array([sum(a.nbytes for a in m) for m in pieces], dtype=np.int64)
    flat = [a for m in pieces for a in m]
    return (np.concatenate(flat) if flat else np.zeros(0, np.uint8)), sizes


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


def exchange(arrays_of, message_of, name):
    """One gather of ``arrays_of(rank)`` and one scatter of ``message_of(r)`` to each rank r:
    (the root's gathered arrays, whether each rank's checks held, gathered from every rank)."""
    gathered = gather_patiently(arrays_of(rank), group, root=0, name=name)
    want = np.concatenate([a.reshape(-1).view(np.uint8) for a in message_of(rank)])
    got = scatter_bytes(pack_messages([message_of(r) for r in range(size)]) if rank == 0
                        else None, np.empty(len(want), np.uint8), group, name=name)
    mine = {"scatter": bool(got.dtype == np.uint8 and np.array_equal(got, want)),
            "gather_elsewhere_none": rank == 0 or gathered is None}
    return gathered, group.comm.gather(mine, root=0)


def gathered_right(gathered, arrays_of, positions):
    ok = True
    for i in range(positions):
        whole, counts = gathered[i]
        parts = [arrays_of(r)[i] for r in range(size)]
        want = np.concatenate(parts)
        ok = ok and (whole.dtype == want.dtype and whole.shape == want.shape
                     and np.array_equal(whole, want) and list(counts) == [len(p) for p in parts])
    return bool(ok)


gathered, everyone = exchange(rank_arrays, message, "the test's rows")
if rank == 0:
    for i in range(3):
        ok = gathered_right([gathered[i]], lambda r: rank_arrays(r)[i:], 1)
        results[f"rows-gather-position{i}"] = {"err": 0.0 if ok else 1.0, "ok": ok}
    for what in ("scatter", "gather_elsewhere_none"):
        ok = all(m[what] for m in everyone)
        results[f"rows-{what}"] = {"err": 0.0 if ok else 1.0, "ok": ok}

# The same through the host's shared memory (meeting_rows.py: this job's ranks share one):
# rounds in a row (both sets of gather slots in turn), a rank whose message does not fit its
# slot (every rank's goes by MPI then), and a scatter with no meeting since the last one (by
# MPI: a rank may still be reading its slot). Records which way each went.
slots = group.meeting_rows()
big = slots.capacity // 4 + 1   # float32s: more than one slot


def too_big(r):   # rank 1's gather and its message from the root do not fit
    return [np.arange(big if r == 1 else 3, dtype=np.float32) + r]


paths = []
for label, arrays_of, message_of in [("round1", rank_arrays, message),
                                     ("round2", rank_arrays, message),
                                     ("round3", rank_arrays, message),
                                     ("too_big", too_big, too_big)]:
    before = (dict(slots.in_slots), dict(slots.by_mpi))
    gathered, everyone = exchange(arrays_of, message_of, f"the test's {label}")
    paths.append([{k: d[k] - b[k] for k in d} for d, b in zip((slots.in_slots, slots.by_mpi),
                                                               before)])
    if rank == 0:
        ok = gathered_right(gathered, arrays_of, len(arrays_of(0))) and \
            all(m["scatter"] and m["gather_elsewhere_none"] for m in everyone)
        results[f"slots-{label}"] = {"err": 0.0 if ok else 1.0, "ok": ok}
# two scatters with no meeting between: the first in the slots (a meeting just now), the
# second by MPI
group.meet()
before = dict(slots.by_mpi)
for label in ("first", "second"):
    got = scatter_bytes(pack_messages([message(r) for r in range(size)]) if rank == 0 else None,
                        np.empty(sum(a.nbytes for a in message(rank)), np.uint8), group,
                        name=f"the test's {label} scatter in a row")
    ok = all(group.comm.allgather(bool(np.array_equal(
        got, np.concatenate([a.reshape(-1).view(np.uint8) for a in message(rank)])))))
    results[f"slots-scatter-{label}-in-a-row"] = {"err": 0.0 if ok else 1.0, "ok": ok}
paths.append({"by_mpi_in_a_row": slots.by_mpi["scatter"] - before["scatter"]})
everyone = group.comm.gather(paths, root=0)
if rank == 0:
    results["slots-paths"] = {"err": 0.0, "ok": all(p == everyone[0] for p in everyone),
                              "paths": everyone[0]}

if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)
kv.close()
