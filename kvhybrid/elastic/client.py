"""The client half of elastic averaging (MXNET-MPI's Elastic2): w ← w − α(w − w̃)."""
from __future__ import annotations

from mxnet.ndarray import NDArray


def pull_toward_center(weight: NDArray, center: NDArray, alpha: float) -> None:
    """Move ``weight`` a fraction ``alpha`` of the way to ``center``, in place (MXNet
    operators, so it runs where the arrays live)."""
    if weight.size == 0:
        return
    weight *= 1.0 - alpha
    weight += alpha * center.as_in_context(weight.context)
