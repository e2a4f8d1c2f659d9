"""MXNet's 2-bit gradient compression with error feedback, as a correct sum over a group.

MXNet's ``dist_sync`` with ``{'type': '2bit', 'threshold': t}``: each worker adds its
gradient to a residual it keeps per key, sends ``+t`` where the residual reached ``t``,
``-t`` where it reached ``-t`` and 0 elsewhere (2 bits an element), and keeps the rest
for its next push; the servers sum what the workers sent. ``TwoBitCompressor.allreduce``
computes that same sum inside an MPI group: the ranks allgather their packed codes (1/16
of float32's bytes) and every rank adds them up in the same way, so every rank holds the
same sum, the one MXNet's servers would have made.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Hashable, Mapping

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..errors import KeyValueError
from .group import Group

log = logging.getLogger(__name__)

#: MXNet's default threshold (src/kvstore/gradient_compression.h)
DEFAULT_THRESHOLD = 0.5


@dataclass(frozen=True)
class CompressionParams:
    """What ``set_gradient_compression`` was given, checked."""
    type: str
    threshold: float

    @classmethod
    def parse(cls, params: Mapping) -> "CompressionParams":
        if not isinstance(params, Mapping) or "type" not in params:
            raise KeyValueError("set_gradient_compression needs a dict with a 'type', e.g. "
                                f"{{'type': '2bit', 'threshold': 0.5}}; got {params!r}")
        kind = params["type"]
        unknown = sorted(set(params) - {"type", "threshold"})
        if kind != "2bit":
            raise KeyValueError(f"gradient compression type {kind!r} is not supported: "
                                "hybrid-mpi supports '2bit' (as MXNet 1.9.1 does)")
        if unknown:
            raise KeyValueError(f"set_gradient_compression got {', '.join(map(repr, unknown))}: "
                                "2bit compression takes 'type' and 'threshold' only")
        try:
            threshold = float(params.get("threshold", DEFAULT_THRESHOLD))
        except (TypeError, ValueError):
            threshold = float("nan")
        if not threshold > 0:
            raise KeyValueError(f"2bit compression threshold must be a number > 0, got "
                                f"{params.get('threshold')!r}")
        return cls(kind, threshold)

    def as_mxnet(self) -> Dict[str, object]:
        return {"type": self.type, "threshold": self.threshold}


def pack(codes: np.ndarray) -> np.ndarray:
    """Codes 0 (zero), 1 (+t), 2 (-t), four to a byte."""
    padded = np.zeros(-(-codes.size // 4) * 4, np.uint8)
    padded[:codes.size] = codes
    q = padded.reshape(-1, 4)
    return q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)


def unpack(packed: np.ndarray, count: int) -> np.ndarray:
    shifts = np.array([0, 2, 4, 6], np.uint8)
    return ((packed[:, None] >> shifts) & 3).reshape(-1)[:count]


def quantize(grad: np.ndarray, residual: np.ndarray, threshold: float) -> np.ndarray:
    """Add ``grad`` to ``residual`` (in place), take out ±threshold where it reached that,
    and return the codes (MXNet's quantize_2bit: ``>= t`` is +t, ``<= -t`` is -t)."""
    residual += grad
    t = residual.dtype.type(threshold)
    pos, neg = residual >= t, residual <= -t
    residual[pos] -= t
    residual[neg] += t
    return pos.astype(np.uint8) | (neg.astype(np.uint8) << 1)


class TwoBitCompressor:
    """Per-key residuals of one worker, and the group sum of its compressed gradients."""

    def __init__(self, params: CompressionParams):
        self.params = params
        self.residuals: Dict[Hashable, np.ndarray] = {}

    def allreduce(self, key: Hashable, arr: NDArray, group: Group, name: str = "") -> None:
        """Replace ``arr`` (this rank's gradient of ``key``) by the group's sum of the
        ranks' 2-bit compressed gradients, the same on every rank."""
        if arr.size == 0:
            return
        grad = arr.asnumpy().reshape(-1)
        residual = self.residuals.get(key)
        if residual is None:
            residual = self.residuals[key] = np.zeros_like(grad)
        packed = pack(quantize(grad, residual, self.params.threshold))
        everyone = np.empty((group.size, packed.size), np.uint8)
        with group.watchdog.waiting(lambda: f"allgather of the 2bit codes of {name or key} "
                                            f"({packed.size} bytes) on group {group.name}"):
            group.comm.Allgather(packed, everyone)
        group.bytes_sent["compressed"] = group.bytes_sent.get("compressed", 0) + packed.nbytes
        steps = np.zeros(grad.size, np.int32)   # (number of +t) - (number of -t)
        for r in range(group.size):
            codes = unpack(everyone[r], grad.size)
            steps += codes == 1
            steps -= codes == 2
        total = steps.astype(grad.dtype) * grad.dtype.type(self.params.threshold)
        arr[:] = mx.nd.array(total.reshape(arr.shape), ctx=arr.context, dtype=arr.dtype)
