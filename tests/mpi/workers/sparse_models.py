"""Models with a sparse embedding plus dense layers, and their data, for workers and the reference.

kind "grad":   nn.Embedding(sparse_grad=True): a dense weight that gets row_sparse gradients.
kind "weight": contrib.nn.SparseEmbedding: a row_sparse weight, pulled row by row.
kind "tables": two SparseEmbedding tables, one for each half of a sample's words.
kind "dense":  nn.Embedding with dense gradients: the same model with no rows at all.
Both set a learning-rate and a weight-decay multiplier, which the servers must honour too.
"""
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

VOCAB, DIM, WORDS, HIDDEN, CLASSES = 1000, 8, 6, 16, 4
OPTIMIZER = {"learning_rate": 0.5, "momentum": 0.9, "wd": 1e-3}


class BagOfWords(gluon.Block):
    def __init__(self, kind: str):
        super().__init__()
        with self.name_scope():
            if kind == "grad":
                self.embed = nn.Embedding(VOCAB, DIM, sparse_grad=True)
            elif kind == "dense":
                self.embed = nn.Embedding(VOCAB, DIM)
            elif kind in ("weight", "tables"):
                self.embed = mx.gluon.contrib.nn.SparseEmbedding(VOCAB, DIM)
            else:
                raise ValueError(kind)
            self.second = mx.gluon.contrib.nn.SparseEmbedding(VOCAB, DIM) \
                if kind == "tables" else None
            self.hidden = nn.Dense(HIDDEN, activation="relu",
                                   in_units=DIM * (2 if self.second else 1))
            self.out = nn.Dense(CLASSES, in_units=HIDDEN)
        self.embed.weight.wd_mult = 0.5
        self.out.bias.lr_mult = 2.0

    def tables(self):
        """(table, which of a sample's words it embeds) per table."""
        if self.second is None:
            return [(self.embed, slice(None))]
        half = WORDS // 2
        return [(self.embed, slice(0, half)), (self.second, slice(half, None))]

    def forward(self, ids):
        if self.second is None:
            return self.out(self.hidden(self.embed(ids).mean(axis=1)))
        parts = [table(ids[:, words]).mean(axis=1) for table, words in self.tables()]
        return self.out(self.hidden(mx.nd.concat(*parts, dim=1)))


def make_sparse_net(kind: str = "grad"):
    return BagOfWords(kind)


def make_trainer(net, kind: str, kvstore, batch: int, lazy: bool = True, fused: bool = False):
    """A Trainer and the step() argument that makes it scale gradients by 1/batch.

    With a sparse weight Gluon creates the store at the first forward pass, before step()
    sets rescale_grad, and a dist store refuses a later change: pass it up front, step(1).
    ``lazy=False``: every row is updated, as when the gradient is densified. ``fused``:
    kvhybrid.DistributedTrainer (one store call per step for the dense keys)."""
    params = dict(OPTIMIZER, lazy_update=lazy)
    if fused:
        import kvhybrid
        make = kvhybrid.DistributedTrainer
    else:
        make = gluon.Trainer
    if kind in ("weight", "tables") and kvstore not in (None, "local"):
        params["rescale_grad"] = 1.0 / batch
        return make(net.collect_params(), "sgd", params, kvstore=kvstore), 1
    return make(net.collect_params(), "sgd", params, kvstore=kvstore), batch


def sparse_batch(step: int, n: int):
    rng = np.random.RandomState(11 + step)
    ids = rng.zipf(1.3, size=(n, WORDS)) % VOCAB       # few hot rows, a long tail
    return ids.astype(np.float32), rng.randint(0, CLASSES, size=n).astype(np.float32)


def sparse_train_steps(net, trainer, step_arg, steps, per_device, ctxs, offset, total,
                       prefetch: bool = False, after_step=lambda: None):
    """``prefetch``: hand the store the next batch's ids before each step
    (kvhybrid.prefetch), as a training loop that reads ahead does. ``after_step`` runs
    after each step."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(steps):
        x, y = sparse_batch(step, total)
        losses = []
        with autograd.record():
            for d, ctx in enumerate(ctxs):
                lo = offset + d * per_device
                losses.append(loss_fn(net(mx.nd.array(x[lo:lo + per_device], ctx=ctx)),
                                      mx.nd.array(y[lo:lo + per_device], ctx=ctx)))
        autograd.backward(losses)
        if prefetch:   # the last step's prefetch is never used: the pull after falls back
            import kvhybrid
            following, _ = sparse_batch(step + 1, total)
            kvhybrid.prefetch(trainer, {table.weight: [
                following[offset + d * per_device:offset + (d + 1) * per_device, words]
                for d in range(len(ctxs))] for table, words in net.tables()})
        trainer.step(step_arg)
        after_step()


def local_weights(net) -> dict:
    """This process's own values (before any Trainer): what rank 0 starts from."""
    out = {}
    for name, p in sorted(net._collect_params_with_prefix().items()):
        arr = p._data[0]
        out[name] = (arr.tostype("default") if arr.stype != "default" else arr).asnumpy()
    return out


def set_weights(net, values: dict) -> None:
    for name, p in net._collect_params_with_prefix().items():
        for arr in p._data:
            arr[:] = mx.nd.array(values[name], ctx=arr.context)


def trained_weights(net) -> dict:
    """Every parameter's current value; sparse weights are pulled whole through the Trainer."""
    out = {}
    for name, p in sorted(net._collect_params_with_prefix().items()):
        if p._stype == "row_sparse":
            rows = mx.nd.arange(p.shape[0], ctx=p.list_ctx()[0])
            out[name] = p.row_sparse_data(rows).tostype("default").asnumpy()
        else:
            out[name] = p.data(p.list_ctx()[0]).asnumpy()
    return out


SMALL_TABLE = (20, 4)


def small_table_store():
    """A store holding one sparse weight 'w' (20 x 4, ones) on the servers, SGD (lr 1) there,
    and this rank's gradient: ones in rows rank and 10 + rank (they go down by 1 a push)."""
    import kvhybrid  # noqa: F401
    kv = mx.kv.create("hybrid-mpi")
    kv.init("w", mx.nd.ones(SMALL_TABLE).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))

    def grad():
        return mx.nd.sparse.row_sparse_array(
            (np.ones((2, 4), np.float32), [kv.rank, 10 + kv.rank]), shape=SMALL_TABLE)
    return kv, grad


def full_path_pulls(kv) -> list:
    """The keys of ``kv``'s pulls that take the full checks (``_pull_prefetched``, which waits
    for the rows), appended as they come."""
    keys, full = [], kv.pulls._pull_prefetched

    def counted(key, *args):
        keys.append(key)
        return full(key, *args)

    kv.pulls._pull_prefetched = counted
    return keys
