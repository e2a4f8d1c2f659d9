"""The two tasks of the experiments: real images and a synthetic sparse language model.

- ``digits``: the UCI handwritten digits as scikit-learn ships them (1,797 8×8 images, in
  ``data/digits.npz``: no download, no scikit-learn), an MLP, validation accuracy.
- ``lm``: a synthetic next-word task with a Zipf vocabulary, so each step touches a few
  rows of a large embedding (``SparseEmbedding``: a row_sparse weight, as MXNet's own
  ``dist_sync`` needs for sparse training; it crashes its servers on
  ``nn.Embedding(sparse_grad=True)``),
  validation accuracy and perplexity. The word to predict belongs to one of ``classes``
  classes, set by the last context word (90 % of the time; otherwise at random): a model
  must learn a row per word, and rare words are learnt late, as in a real language model.

Every task gives the same data on every worker (a worker trains on its shard) and the
same initial weights (a fixed seed), whatever the store.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Dict, Tuple

import numpy as np
import mxnet as mx
from mxnet.gluon import nn
from mxnet.gluon.contrib.nn import SparseEmbedding

Arrays = Tuple[np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    train: Arrays
    valid: Arrays
    build: Callable[[], nn.Block]
    #: validation perplexity is worth reporting (a language model)
    perplexity: bool = False


#: the digits, as scikit-learn ships them (``data/README.md``)
DIGITS = Path(__file__).resolve().parent / "data" / "digits.npz"


def digits(seed: int = 0) -> Task:
    with np.load(DIGITS) as data:
        x = (data["images"] / 16.0).astype(np.float32)
        y = data["labels"].astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(y))
    x, y = x[order], y[order]
    cut = len(y) * 4 // 5

    def build() -> nn.Block:
        net = nn.HybridSequential()
        net.add(nn.Dense(128, activation="relu", in_units=64),
                nn.Dense(128, activation="relu", in_units=128), nn.Dense(10, in_units=128))
        return net

    return Task("digits", (x[:cut], y[:cut]), (x[cut:], y[cut:]), build)


class BagLM(nn.Block):
    """Context words → embeddings (a row_sparse weight) → two dense layers → the next
    word's class. A ``Block``: ``SparseEmbedding`` asks the store for the batch's rows
    before each forward pass, which a hybridized graph cannot."""

    def __init__(self, vocab: int, dim: int, context: int, hidden: int, classes: int):
        super().__init__()
        self.embed = SparseEmbedding(vocab, dim)
        self.mlp = nn.HybridSequential()
        self.mlp.add(nn.Dense(hidden, activation="relu", in_units=context * dim),
                     nn.Dense(classes, in_units=hidden))

    def forward(self, ids):
        return self.mlp(self.embed(ids).reshape((0, -1)))


#: the LM's table: rows (words) and columns
LM_VOCAB, LM_DIM = 20000, 32


def sparse_lm(vocab: int = LM_VOCAB, dim: int = LM_DIM, context: int = 4, classes: int = 50,
              samples: int = 65536, valid: int = 4096, zipf: float = 1.1, seed: int = 0) -> Task:
    rng = np.random.RandomState(seed)
    weights = 1.0 / np.arange(1, vocab + 1) ** zipf
    words = rng.choice(vocab, size=(samples + valid, context), p=weights / weights.sum())
    word_class = rng.randint(0, classes, vocab)
    y = word_class[words[:, -1]]
    noise = rng.rand(len(y)) < 0.1
    y[noise] = rng.randint(0, classes, int(noise.sum()))
    x, y = words.astype(np.float32), y.astype(np.float32)

    def build() -> nn.Block:
        return BagLM(vocab, dim, context, 128, classes)

    return Task("lm", (x[:samples], y[:samples]), (x[samples:], y[samples:]), build,
                perplexity=True)


TASKS: Dict[str, Callable[[], Task]] = {"digits": digits, "lm": sparse_lm}


def evaluate(net: nn.Block, data: Arrays, batch: int = 1024) -> Dict[str, float]:
    """Accuracy, mean cross-entropy and perplexity of ``net`` on ``data``."""
    x, y = data
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    correct, loss = 0.0, 0.0
    for start in range(0, len(y), batch):
        xb, yb = mx.nd.array(x[start:start + batch]), mx.nd.array(y[start:start + batch])
        out = net(xb)
        correct += float((out.argmax(axis=1) == yb).sum().asscalar())
        loss += float(loss_fn(out, yb).sum().asscalar())
    loss /= len(y)
    return {"accuracy": correct / len(y), "loss": loss, "perplexity": float(np.exp(loss))}
