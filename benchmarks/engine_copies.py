"""How an engine bucket's keys move in and out of its buffer: one operator or a copy per key.

    python -m benchmarks.engine_copies [--rounds 3] [--repeats 200]

For each model's dense keys taken as one bucket (``kvstore/overlap.py``), the
CPU time (this process, all threads: the caller's Python and MXNet's engine) and the wall
time per step of:

* ``split``: the updated weights into the outputs with one ``_split_v2`` (the store's earlier way);
* ``copy per key, out``: one ``copyto`` per key (what the store does since);
* ``concat``: the gradients into the bucket with one ``concat``;
* ``copy per key, in``: one ``copyto`` per key.

Rounds alternate the order of the ways. Writes ``engine_copies.{md,json,png}`` into ``--out``.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

from .common import DIAGNOSTICS_OUT, footer, grouped_bars, save_figure, write_outputs

log = logging.getLogger("benchmarks")

WAYS = ("split", "copy per key, out", "concat", "copy per key, in")


def dense_shapes(model: str) -> List[Tuple[int, ...]]:
    """The shapes of a benchmark model's dense parameters."""
    import mxnet as mx
    from .model_zoo import MODELS
    net = MODELS[model].build(False)   # (the tables dense, so that a call needs no Trainer)
    net.initialize(mx.init.Xavier())
    inputs, _ = MODELS[model].batch(np.random.RandomState(0), 2, 5)
    net(*[mx.nd.array(x) for x in inputs])   # (shapes are known after a call)
    return [p.shape for name, p in net.collect_params().items() if "embedding" not in name]


def ways(shapes) -> Dict[str, Callable[[], None]]:
    import mxnet as mx
    sizes = [int(np.prod(s)) for s in shapes]
    starts = tuple(np.cumsum([0] + sizes[:-1]).tolist())
    buffer = mx.nd.ones((sum(sizes),))
    parts = [buffer[s:s + n] for s, n in zip(starts, sizes)]
    arrays = [mx.nd.ones((n,)) for n in sizes]

    def split():
        mx.nd._internal._split_v2(buffer, indices=starts, axis=0, squeeze_axis=False,
                                  sections=0, out=arrays)

    def copies_out():
        for p, a in zip(parts, arrays):
            p.copyto(a)

    def concat():
        mx.nd.concat(*arrays, dim=0, out=buffer)

    def copies_in():
        for a, p in zip(arrays, parts):
            a.copyto(p)

    return dict(zip(WAYS, (split, copies_out, concat, copies_in)))


def measure(fn: Callable[[], None], repeats: int) -> Tuple[float, float]:
    """(CPU ms, wall ms) per call, the engine's work included (``waitall`` at the end)."""
    import mxnet as mx
    for _ in range(10):
        fn()
    mx.nd.waitall()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        fn()
    mx.nd.waitall()
    return ((time.process_time() - cpu) * 1e3 / repeats,
            (time.perf_counter() - wall) * 1e3 / repeats)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["lm", "nmt", "cnn"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", default=DIAGNOSTICS_OUT)
    p.add_argument("--name", default="engine_copies")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    for model in args.models:
        shapes = dense_shapes(model)
        fns = ways(shapes)
        got = results[model] = {w: {"cpu": [], "wall": [], "keys": len(shapes),
                                    "mb": sum(int(np.prod(s)) for s in shapes) * 4 / 2**20}
                                for w in WAYS}
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                cpu, wall = measure(fns[way], args.repeats)
                got[way]["cpu"].append(cpu)
                got[way]["wall"].append(wall)
        log.info("engine_copies: %s (%d keys, %.2f MB): %s", model, len(shapes),
                 got[WAYS[0]]["mb"], ", ".join(
                     f"{w} {statistics.median(got[w]['cpu']):.3f} ms" for w in WAYS))
    lines = ["| model | keys | MB | way | CPU ms per step | wall ms per step |",
             "|---|---:|---:|---|---:|---:|"]
    for model, got in results.items():
        for way in WAYS:
            g = got[way]
            lines.append(f"| {model} | {g['keys']} | {g['mb']:.2f} | {way} | "
                         f"{statistics.median(g['cpu']):.3f} ({min(g['cpu']):.3f}–"
                         f"{max(g['cpu']):.3f}) | {statistics.median(g['wall']):.3f} |")
    lines += ["", f"Median over {args.rounds} rounds (range) of {args.repeats} calls each, "
              "the order of the ways alternated; CPU is this process's, MXNet's engine "
              "threads included.", *footer("engine_copies", argv)]

    def plot(res, path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        grouped_bars(ax, list(res), {w: [statistics.median(res[m][w]["cpu"]) for m in res]
                                     for w in WAYS})
        ax.set_ylabel("CPU ms per step")
        ax.set_title("A bucket's keys into and out of its buffer")
        ax.legend()
        save_figure(fig, path)

    write_outputs(args.out, args.name, "\n".join(lines) + "\n", results, plot)


if __name__ == "__main__":
    main()
