"""The models of the model-level benchmark, proportioned by the bytes each moves per step
(what matters for communication), after Parallax's LM, NMT and ResNet-50:

- ``lm``: a 200,000 × 64 embedding looked up with Zipf word ids, then dense layers that move
  about a third of a step's bytes;
- ``nmt``: two 50,000 × 64 embeddings (source and target words) and dense layers that move
  about two thirds;
- ``cnn``: a small all-dense-gradient convolutional net on 32 × 32 images.

``sparse=True`` makes each embedding a ``SparseEmbedding`` (a row_sparse weight: only the
rows a batch touches travel), as kvhybrid and MXNet's ``dist_sync`` train them;
``sparse=False`` a dense ``nn.Embedding``, as Horovod must (it allreduces dense gradients).
With plain SGD (no momentum, no weight decay) both update the same rows by the same
amounts, so every system takes the same steps.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List

import numpy as np
import mxnet as mx
from mxnet.gluon import nn
from mxnet.gluon.contrib.nn import SparseEmbedding

DIM = 64


def embedding(vocab: int, sparse: bool) -> nn.Block:
    return SparseEmbedding(vocab, DIM) if sparse else nn.Embedding(vocab, DIM)


class BagOfWords(nn.Block):
    """Sum of the word vectors of each sample's ``tokens`` words → dense layers → a class."""

    def __init__(self, vocabs: List[int], hidden: int, classes: int, sparse: bool):
        super().__init__()
        self.tables = [embedding(v, sparse) for v in vocabs]
        for i, table in enumerate(self.tables):
            self.register_child(table, f"table{i}")
        self.mlp = nn.HybridSequential()
        self.mlp.add(nn.Dense(hidden, activation="relu", in_units=DIM * len(vocabs)),
                     nn.Dense(hidden, activation="relu", in_units=hidden),
                     nn.Dense(classes, in_units=hidden))

    def forward(self, *ids):
        bags = [table(x).sum(axis=1) for table, x in zip(self.tables, ids)]
        return self.mlp(mx.nd.concat(*bags, dim=1) if len(bags) > 1 else bags[0])


def cnn() -> nn.HybridBlock:
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1, activation="relu", in_channels=3), nn.MaxPool2D(2),
            nn.Conv2D(64, 3, padding=1, activation="relu", in_channels=32), nn.MaxPool2D(2),
            nn.Flatten(), nn.Dense(256, activation="relu", in_units=64 * 8 * 8),
            nn.Dense(10, in_units=256))
    return net


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    build: Callable[[bool], nn.Block]
    #: inputs of one batch: a list of arrays (word ids or images) and labels
    batch: Callable[[np.random.RandomState, int, int], tuple]
    #: words (or images) one sample counts for in the throughput
    words_per_sample: Callable[[int], int]
    sparse_keys: bool
    #: rows of each embedding table (each sample's inputs index them in order)
    vocabs: tuple = ()
    #: SGD's learning rate per sample of the global batch: the CNN's is small enough that
    #: its 60 steps are not chaotic (at 0.05, MXNet's own dist_sync, which sums workers in
    #: arrival order, ended 60 steps 0.3 % apart from itself run to run)
    lr: float = 0.05


def _zipf_ids(rng, vocab: int, shape, s: float = 1.1) -> np.ndarray:
    """Zipf word ids (rank 1 = id 0), cut to the vocabulary."""
    return np.minimum(rng.zipf(s, size=shape) - 1, vocab - 1).astype(np.float32)


LM_VOCAB, NMT_VOCAB = 200_000, 50_000


def _lm_batch(rng, batch: int, tokens: int):
    ids = _zipf_ids(rng, LM_VOCAB, (batch, tokens))
    return [ids], (ids[:, 0] % 100).astype(np.float32)


def _nmt_batch(rng, batch: int, tokens: int):
    src, tgt = _zipf_ids(rng, NMT_VOCAB, (batch, tokens)), _zipf_ids(rng, NMT_VOCAB, (batch, tokens))
    return [src, tgt], ((src[:, 0] + tgt[:, 0]) % 100).astype(np.float32)


def _cnn_batch(rng, batch: int, tokens: int):
    y = rng.randint(0, 10, batch)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) + y[:, None, None, None] * 0.1
    return [x], y.astype(np.float32)


MODELS: Dict[str, Model] = {
    "lm": Model("lm", lambda sparse: BagOfWords([LM_VOCAB], 80, 100, sparse), _lm_batch,
                lambda tokens: tokens, True, vocabs=(LM_VOCAB,)),
    "nmt": Model("nmt", lambda sparse: BagOfWords([NMT_VOCAB, NMT_VOCAB], 256, 100, sparse),
                 _nmt_batch, lambda tokens: 2 * tokens, True, vocabs=(NMT_VOCAB, NMT_VOCAB)),
    "cnn": Model("cnn", lambda sparse: cnn(), _cnn_batch, lambda tokens: 1, False, lr=0.01),
}


#: batches a worker cycles through, step after step
WORKER_BATCHES = 8


def worker_batches(model: Model, rank: int, batch: int, tokens: int) -> list:
    """The batches rank ``rank`` trains on (``benchmarks.model_worker``), from its own seed:
    the same on every run, so what a run's steps touched can be worked out afterwards."""
    rng = np.random.RandomState(1000 + rank)
    return [model.batch(rng, batch, tokens) for _ in range(WORKER_BATCHES)]
