"""Choosing how many pieces a large sparse table is split into (Parallax §4.2).

More pieces spread a table's rows over more server requests that run in parallel and
shrink each; fewer pieces cost less per-request overhead. Parallax models iteration
time as ``t(P) = θ0 + θ1/P + θ2·P``, samples a few P, fits θ by least squares and takes
the best integer P inside the sampled range, unless a sample was measured faster than the
fit promises there: three parameters cannot follow a sharp minimum (a sweep on emulated
hosts measured the fit's best P slower than a sampled one: docs/performance.md), and a
measurement outranks a fit.

``PartitionSearch`` is the sampling schedule: start at the number of server hosts,
double while the time falls, then halve from the start while it falls — at most
``max_samples`` settings, and at least three so that the fit is determined.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

Theta = Tuple[float, float, float]


def fit(ps: Sequence[int], times: Sequence[float]) -> Theta:
    """Least-squares θ of ``t = θ0 + θ1/P + θ2·P`` over the samples (three distinct P at
    least)."""
    ps = np.asarray(ps, dtype=float)
    if len(set(ps.tolist())) < 3:
        raise ValueError(f"fitting t = θ0 + θ1/P + θ2·P needs 3 distinct P, got {sorted(set(ps))}")
    design = np.stack([np.ones_like(ps), 1.0 / ps, ps], axis=1)
    theta, *_ = np.linalg.lstsq(design, np.asarray(times, dtype=float), rcond=None)
    return float(theta[0]), float(theta[1]), float(theta[2])


def predict(theta: Theta, p) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    return theta[0] + theta[1] / p + theta[2] * p


def best_partitions(theta: Theta, low: int, high: int) -> int:
    """The integer P in [low, high] the model says is fastest."""
    candidates = np.arange(low, high + 1)
    return int(candidates[np.argmin(predict(theta, candidates))])


@dataclass
class PartitionSearch:
    """Which P to sample next; feed each measured time back with ``record``."""

    start: int
    max_p: int
    max_samples: int = 5
    samples: Dict[int, float] = field(default_factory=dict)
    _phase: str = "up"   # up: doubling from start; down: halving from start; fill

    def __post_init__(self):
        if self.max_p < 1:
            raise ValueError(f"max_p must be >= 1, got {self.max_p}")
        if not 1 <= self.start <= self.max_p:
            raise ValueError(f"start must be in [1, {self.max_p}], got {self.start}")
        if self.max_samples < 3:
            raise ValueError(f"max_samples must be >= 3 (the fit has 3 parameters), got "
                             f"{self.max_samples}")

    def next(self) -> Optional[int]:
        """The next P to measure, or None when the search is over."""
        if not self.samples:
            return self.start
        if len(self.samples) >= self.max_samples:
            return None
        if self._phase == "up":
            top = max(self.samples)
            if self._improved(top, top // 2) and top * 2 <= self.max_p:
                return top * 2
            self._phase = "down"
        if self._phase == "down":
            low = min(self.samples)
            if low > 1 and (low == self.start or self._improved(low, low * 2)):
                return low // 2
            self._phase = "fill"
        return self._fill()

    def _improved(self, p: int, previous: int) -> bool:
        """``p`` was faster than the setting sampled before it in its direction (the start
        counts as an improvement: there is nothing to compare it with)."""
        return p == self.start or self.samples[p] < self.samples[previous]

    def _fill(self) -> Optional[int]:
        """A third distinct P for the fit: the next power of two above, else below."""
        if len(self.samples) >= 3:
            return None
        p = max(self.samples) * 2
        if p <= self.max_p:
            return p
        p = min(self.samples) // 2
        return p if p >= 1 else None

    def record(self, p: int, seconds: float) -> None:
        self.samples[p] = seconds

    def result(self) -> Tuple[int, Optional[Theta]]:
        """(chosen P, θ) — the fitted argmin inside the sampled range, or the fastest
        sample where it was measured faster than the fit's prediction for that argmin, or
        when fewer than three settings could be measured."""
        ps = sorted(self.samples)
        fastest = min(ps, key=self.samples.get)
        if len(ps) < 3:
            return fastest, None
        theta = fit(ps, [self.samples[p] for p in ps])
        fitted = best_partitions(theta, ps[0], ps[-1])
        if self.samples[fastest] < float(predict(theta, fitted)):
            return fastest, theta
        return fitted, theta

