"""The server half of elastic averaging (MXNET-MPI's Elastic1): w̃ ← w̃ + α(w − w̃).

The parameter servers run whatever optimizer they are sent, on the value they hold
(here the center variable w̃) and what a client pushes (here the client's weights w).
MXNet's own SGD computes ``w̃ ← w̃ − lr·(rescale·g + wd·w̃)``; with ``lr = 1``,
``wd = α``, ``rescale = −α`` and ``g = w`` that is ``w̃ ← (1 − α)·w̃ + α·w``, exactly
Elastic1. Shipping a stock SGD means nothing has to be importable on the servers.
"""
from __future__ import annotations

import mxnet as mx


def center_optimizer(alpha: float) -> mx.optimizer.Optimizer:
    """The optimizer the servers run on the center variables for elastic force ``alpha``."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    return mx.optimizer.SGD(learning_rate=1.0, wd=alpha, rescale_grad=-alpha, momentum=0.0)
