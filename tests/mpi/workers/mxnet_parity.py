"""The checks MXNet 1.9.1's own distributed kvstore test makes of ``dist_sync``
(tests/nightly/dist_sync_kvstore.py: float16 and float32 keys, dense and row_sparse,
duplicate and empty row ids, invalid pulls, 2bit gradient compression), made of
``hybrid-mpi`` — written anew, same expectations.

argv: OUT_DIR MODE [pure-ps]. MODE ``rows`` checks keys of both dtypes and storages and bad
calls; ``compression`` sets 2bit compression first and checks it (MXNet runs these two
apart too). ``pure-ps``: the job runs a client group per worker, where compressed pushes
go through MXNet's compressor, which refuses row_sparse arrays. Every rank writes
OUT_DIR/parity-{MODE}-rank{r}.json: {check: [ok, detail]}.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401  (registers hybrid-mpi)

out_dir, mode = sys.argv[1], sys.argv[2]
pure_ps = sys.argv[3:] == ["pure-ps"]
compress = mode == "compression"
RATE = 2               # the weight grows by RATE * gradient at each push
THRESHOLD = 0.5
SHAPE, BIG = (2, 3), (1200, 1000)   # BIG: past MXNet's big-array bound (10**6 elements)
REPEAT = 3

kv = mx.kv.create("hybrid-mpi")
rank, n = kv.rank, kv.num_workers
checks = {}


def check(name, ok, detail=""):
    checks[name] = [bool(ok), str(detail)[:300]]


def equal(got, want):
    got = got.asnumpy() if isinstance(got, mx.nd.NDArray) else got
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return got.shape == np.broadcast_shapes(got.shape, want.shape) and bool(np.all(got == want))


# -- set up as MXNet's test does: compression, keys, then the optimizer ----------------------
if compress:
    kv.set_gradient_compression({"type": "2bit", "threshold": THRESHOLD})
# (MXNet's test names its keys '3', '99', ...; int keys here, since the Trainer at the end
# shares this store and a store takes keys of one type, as MXNet's do)
dense_keys = {"float32": [3, 99], "float16": [4, 100]}
rsp_keys = {"float32": [9, 11, 97], "float16": [10, 12, 98]}
#: MXNet's compressor, which pure PS pushes through, takes float32 only (as dist_sync)
dtypes = ("float32",) if compress and pure_ps else ("float32", "float16")
for dtype in dtypes:
    for k, s in zip(dense_keys[dtype], (SHAPE, BIG)):
        kv.init(k, mx.nd.ones(s, dtype=dtype))
    for k, s in zip(rsp_keys[dtype], (SHAPE, SHAPE, BIG)) if not compress else ():
        kv.init(k, mx.nd.ones(s, dtype=dtype).tostype("row_sparse"))
#: what one push of (rank + 1) adds to a dense key: each rank's +threshold when compressed
DENSE_STEP = THRESHOLD * RATE * n if compress else RATE * n * (n + 1) / 2
compressed = {1000: SHAPE, 1200: (1211, 1211)}        # start at 0
init_only = {1001: SHAPE, 1201: (1211, 1211)}         # init is never compressed
for k, s in compressed.items():
    kv.init(k, mx.nd.zeros(s))
for k, s in init_only.items():
    kv.init(k, mx.nd.ones(s))
# MXNet's test optimizer, as its test sets it: weight += rescale_grad * grad, then a dense
# state copy of the weight (state[:] = weight), which a row_sparse weight cannot be copied
# into: the servers update such a key as a dense array (kvstore/ps/server.py)
kv.set_optimizer(mx.optimizer.create("test", rescale_grad=RATE, multi_precision=True))
OTHER = {"float32": "float16", "float16": "float32"}   # pulls cast into the out's dtype


if compress:

    # -- compression (dense float32 keys 1000, 1200) ---------------------------------------------
    for k, s in init_only.items():
        got = mx.nd.zeros(s)
        kv.pull(k, out=got)
        check(f"compression_init_not_compressed_{k}", equal(got, 1))
    for k, s in compressed.items():
        got = mx.nd.ones(s)
        kv.pull(k, out=got)
        check(f"compression_pull_before_push_{k}", equal(got, 0))
        kv.push(k, mx.nd.zeros(s))
        kv.pull(k, out=got)
        check(f"compression_zero_push_{k}", equal(got, 0))
        expect = 0.0
        # below the threshold: nothing sent, all kept; then the residual carries it over
        for grad, sent in ((0.4, 0), (THRESHOLD - 0.4, 1), (0.2, 0), (THRESHOLD - 0.2, 1),
                           (THRESHOLD, 1)):
            kv.push(k, mx.nd.ones(s) * grad)
            kv.pull(k, out=got)
            expect += sent * THRESHOLD * RATE * n
            check(f"compression_residual_{k}_{grad:.1f}", equal(got, expect),
                  (got.asnumpy().flat[0], expect))

    rng = np.random.RandomState(123)   # the same gradients on every rank
    for k, s in {1002: SHAPE, 1202: (1211, 1211)}.items():
        kv.init(k, mx.nd.zeros(s))
        residual = np.zeros(s, np.float32)
        ok = True
        for _ in range(REPEAT):
            before = mx.nd.zeros(s)
            kv.pull(k, out=before)
            grad = rng.rand(*s).astype(np.float32)
            kv.push(k, mx.nd.array(grad))
            after = mx.nd.zeros(s)
            kv.pull(k, out=after)
            residual += grad        # MXNet's quantize_2bit, by hand
            sent = np.where(residual >= THRESHOLD, THRESHOLD,
                            np.where(residual <= -THRESHOLD, -THRESHOLD, 0)).astype(np.float32)
            residual -= sent
            ok &= np.allclose((after - before).asnumpy(), sent * n * RATE, rtol=1e-5, atol=1e-5)
        check(f"compression_random_{k}", ok)

    # different gradients on every rank (of both signs): each rank plays every rank's residual
    k, s = 1003, (31, 17)
    kv.init(k, mx.nd.zeros(s))
    rngs = [np.random.RandomState(1000 + r) for r in range(n)]
    residuals = [np.zeros(s, np.float32) for _ in range(n)]
    ok = True
    for _ in range(REPEAT):
        grads = [(g.rand(*s) * 2 - 1).astype(np.float32) for g in rngs]
        before, after = mx.nd.zeros(s), mx.nd.zeros(s)
        kv.pull(k, out=before)
        kv.push(k, mx.nd.array(grads[rank]))
        kv.pull(k, out=after)
        total = np.zeros(s, np.float32)
        for r in range(n):
            residuals[r] += grads[r]
            sent = np.where(residuals[r] >= THRESHOLD, THRESHOLD,
                            np.where(residuals[r] <= -THRESHOLD, -THRESHOLD, 0)).astype(np.float32)
            residuals[r] -= sent
            total += sent
        ok &= np.allclose((after - before).asnumpy(), total * RATE, atol=1e-5)
    check("compression_random_per_rank_gradients", ok)


# -- dense keys, float32 and float16 (compressed in mode compression, as dist_sync does) ----
for dtype in dtypes:
    for k, s in zip(dense_keys[dtype], (SHAPE, BIG)):
        got = mx.nd.zeros(s, dtype=dtype)
        kv.pull(k, out=got)
        check(f"dense_{dtype}_init_{k}", equal(got, 1))
        kv.push(k, mx.nd.ones(s, dtype=dtype) * (rank + 1))   # every rank >= threshold
        kv.pull(k, out=got)
        check(f"dense_{dtype}_push_pull_{k}", equal(got, 1 + DENSE_STEP), got.asnumpy().flat[0])
        cast = mx.nd.zeros(s, dtype=OTHER[dtype])
        kv.pull(k, out=cast)
        check(f"dense_{dtype}_pull_into_{OTHER[dtype]}_{k}",
              cast.dtype == np.dtype(OTHER[dtype]) and equal(cast, 1 + DENSE_STEP),
              (cast.dtype, cast.asnumpy().flat[0]))


if compress:
    try:
        kv.init(1600, mx.nd.ones(SHAPE, dtype="float16"))
        check("compression_float16_key", not pure_ps)
    except mx.base.MXNetError as exc:
        check("compression_float16_key", pure_ps and "float32 only" in str(exc), exc)

    # -- row_sparse pushes under compression: uncompressed (as MXNet); refused in pure PS --------
    try:
        kv.init(1500, mx.nd.ones(SHAPE).tostype("row_sparse"))
        kv.push(1500, mx.nd.ones(SHAPE).tostype("row_sparse"))
        got = mx.nd.sparse.zeros("row_sparse", SHAPE)
        kv.row_sparse_pull(1500, out=got, row_ids=mx.nd.arange(SHAPE[0]))
        check("compression_row_sparse_push", not pure_ps and equal(got, 1 + RATE * n), got)
    except mx.base.MXNetError as exc:
        check("compression_row_sparse_push", pure_ps and "refuses row_sparse" in str(exc), exc)
    try:
        kv.set_gradient_compression({"type": "1bit"})
        check("unsupported_compression_named", False, "no error")
    except mx.base.MXNetError as exc:
        check("unsupported_compression_named", "supports '2bit'" in str(exc), exc)


    # gluon.Trainer(compression_params=...) hands them to the store before its first push
    kv2 = mx.kv.create("hybrid-mpi")
    x = mx.gluon.Parameter("x", shape=(10, 1))
    x.initialize(ctx=mx.cpu(0), init="ones")
    trainer = mx.gluon.Trainer([x], "sgd", {"learning_rate": 1.0}, kvstore=kv2,
                               compression_params={"type": "2bit", "threshold": THRESHOLD})
    with mx.autograd.record():
        y = (rank + 1) * x.data(mx.cpu(0))
    y.backward()
    trainer.step(1)   # every rank's gradient (rank + 1) reaches the threshold: each sends +t
    check("gluon_trainer_compresses", equal(x.data(mx.cpu(0)), 1 - THRESHOLD * n),
          x.data(mx.cpu(0)).asnumpy().flat[0])

else:
    # -- row_sparse keys, float32 and float16 ----------------------------------------------------
    for dtype in ("float32", "float16"):
        k, k_zero, k_big = rsp_keys[dtype]
        # one row per rank (ranks share rows when n > 2: duplicates across ranks)
        grad = mx.nd.zeros(SHAPE, dtype=dtype)
        grad[rank % SHAPE[0]] = rank + 1
        want = np.ones(SHAPE)
        ok = True
        ids_rng = np.random.RandomState(rank)
        for i in range(REPEAT):
            kv.push(k, grad.tostype("row_sparse"))
            for r in range(n):
                want[r % SHAPE[0]] += (r + 1) * RATE
            ids = ids_rng.randint(SHAPE[0], size=SHAPE[0])          # duplicate ids, 2-D, float
            got = mx.nd.zeros(SHAPE, stype="row_sparse", dtype=dtype)
            kv.row_sparse_pull(k, out=got, row_ids=mx.nd.array(ids).reshape((1, -1)).astype(dtype))
            expect = np.zeros(SHAPE)
            expect[ids] = want[ids]
            ok &= equal(got, expect)
        check(f"rows_{dtype}_duplicate_ids", ok)

        # empty gradients: nothing changes; an empty row_ids pulls nothing
        for key, s in ((k_zero, SHAPE), (k_big, BIG)):
            kv.push(key, mx.nd.sparse.zeros("row_sparse", s, dtype=dtype))
            got = mx.nd.sparse.zeros("row_sparse", s, dtype=dtype)
            kv.row_sparse_pull(key, out=got, row_ids=mx.nd.arange(s[0]))
            check(f"rows_{dtype}_empty_push_{key}", equal(got, 1))
            kv.row_sparse_pull(key, out=got, row_ids=mx.nd.array([]))
            check(f"rows_{dtype}_empty_row_ids_{key}", equal(got, 0))
            # MXNet's test pulls these keys into float32 outs whatever their dtype
            cast = mx.nd.sparse.zeros("row_sparse", s, dtype=OTHER[dtype])
            kv.row_sparse_pull(key, out=cast, row_ids=mx.nd.arange(s[0]))
            check(f"rows_{dtype}_pull_into_{OTHER[dtype]}_{key}",
                  cast.dtype == np.dtype(OTHER[dtype]) and equal(cast, 1), cast.dtype)

        # a big table, rows picked per rank
        big_grad = np.zeros(BIG, np.float32)
        mine = np.arange(0, BIG[0], 2 * (rank + 1))
        big_grad[mine] = rank + 1
        big_want = np.ones(BIG)
        kv.push(k_big, mx.nd.array(big_grad, dtype=dtype).tostype("row_sparse"))
        for r in range(n):
            big_want[np.arange(0, BIG[0], 2 * (r + 1))] += (r + 1) * RATE
        ids = np.random.RandomState(rank).randint(BIG[0], size=BIG[0])
        got = mx.nd.zeros(BIG, stype="row_sparse", dtype=dtype)
        kv.row_sparse_pull(k_big, out=got, row_ids=mx.nd.array(ids))
        expect = np.zeros(BIG)
        expect[ids] = big_want[ids]
        check(f"rows_{dtype}_big_table", equal(got, expect.astype(dtype)))


    # -- init then pull, float32 and float16 keys, small and big (MXNet's test_sync_init) -------
    for i in range(8):
        k, dtype, s = 1700 + i, ("float32", "float16")[i % 2], (SHAPE, BIG)[i // 4]
        kv.init(k, mx.nd.ones(s, dtype=dtype) * i)
        got = mx.nd.zeros(s, dtype=dtype)
        kv.pull(k, out=got)
        check(f"init_then_pull_{dtype}_{k}", equal(got, i))

    # -- invalid operations: MXNetError, named cause ---------------------------------------------
    rsp_out = mx.nd.ones((2, 2)).tostype("row_sparse")
    try:
        kv.pull(1800, out=rsp_out, ignore_sparse=False)
        check("pull_uninitialised_key_raises_mxnet_error", False, "no error")
    except mx.base.MXNetError as exc:
        check("pull_uninitialised_key_raises_mxnet_error", "never initialised" in str(exc), exc)
    try:
        kv.pull(3, out=mx.nd.zeros((5, 5)))
        check("pull_wrong_shape_raises_mxnet_error", False, "no error")
    except mx.base.MXNetError as exc:
        check("pull_wrong_shape_raises_mxnet_error", "shape (5, 5)" in str(exc), exc)
    kv.init(999, mx.nd.ones((2, 2)).tostype("row_sparse"))
    skipped = mx.nd.sparse.zeros("row_sparse", (2, 2))
    kv.pull(999, out=skipped)   # ignore_sparse=True: the row_sparse out is left alone
    check("pull_ignore_sparse_skips_row_sparse_out", skipped.indices.size == 0)
    dense_out = mx.nd.zeros(SHAPE)
    kv.pull([3, 999], out=[dense_out, skipped])
    check("pull_ignore_sparse_fills_the_dense_outs", equal(dense_out, 1 + DENSE_STEP))
    # dist_sync refuses ignore_sparse=False; the store gives the whole value, every row, as
    # MXNet's local stores do
    kv.pull(999, out=skipped, ignore_sparse=False)
    check("pull_row_sparse_out_without_ignore_sparse_gets_every_row",
          skipped.stype == "row_sparse" and equal(skipped, 1), skipped.asnumpy().tolist())
    # -- a Trainer over the store resets nothing by loading (MXNet's test_gluon_trainer_reset):
    # last, since its Trainer sets its own optimizer on the store
    params = mx.gluon.ParameterDict()
    x = params.get("x", shape=(4, 2), lr_mult=1.0, stype="row_sparse")
    params.initialize(ctx=mx.cpu(0), init="zeros")
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv)
    saved = os.path.join(out_dir, f"trainer-reset-{rank}.params")
    os.makedirs(out_dir, exist_ok=True)
    params.save(saved)
    x.row_sparse_data(mx.nd.arange(0, 4))
    check("gluon_trainer_updates_on_the_store", trainer._kv_initialized
          and trainer._update_on_kvstore)
    try:
        params.load(saved)
        check("gluon_load_after_the_store_took_the_weights_raises", False, "no error")
    except RuntimeError as exc:
        check("gluon_load_after_the_store_took_the_weights_raises", True, exc)

os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"parity-{mode}-rank{rank}.json"), "w") as f:
    json.dump(checks, f)
print(f"rank {rank}: {sum(ok for ok, _ in checks.values())}/{len(checks)} checks passed")
