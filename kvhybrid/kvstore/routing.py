"""Where a row_sparse key's gradients travel, decided by how sparse its use really is.

Parallax (§3.1, Table 3) counts the bytes each machine sends and receives per
iteration for a variable of ``w`` bytes on ``N`` machines when each worker touches a
fraction α of its rows (α = rows touched ÷ rows, averaged over steps):

===========  =====================  ======================
             one variable           m variables
===========  =====================  ======================
dense,  PS   2 w (N-1)              4 w m (N-1)/N
dense,  AR   4 w (N-1)/N            4 w m (N-1)/N
sparse, PS   2 α w (N-1)            4 α w m (N-1)/N
sparse, AR   2 α w (N-1)            2 α w m (N-1)
===========  =====================  ======================

A row_sparse key can go three ways here: its rows to the parameter servers (sparse
PS), its rows gathered in the group (sparse AR, ``Allgatherv``: no servers), or the
whole gradient densified and summed like a dense key (dense AR). ``decide`` takes the
way with fewer bytes per machine (the *m variables* column: a table is split over
every server, so no server holds it alone); ``ar_efficiency`` > 1 says a byte moves
that many times faster by allreduce than through the servers (the paper's "efficient
network utilization of AR").
"""
from __future__ import annotations

from dataclasses import dataclass

ROUTES = ("servers", "rows", "dense")


def transfer_bytes(kind: str, arch: str, w: float, n: int, alpha: float = 1.0, m: int = 1,
                   one_variable: bool = False) -> float:
    """Parallax Table 3: bytes per machine per iteration. ``kind`` is dense or sparse,
    ``arch`` ps or ar, ``w`` bytes per variable, ``n`` machines, ``m`` variables."""
    if kind not in ("dense", "sparse") or arch not in ("ps", "ar"):
        raise ValueError(f"kind must be dense or sparse and arch ps or ar, got {kind!r}, {arch!r}")
    if n < 1 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need n >= 1 and 0 <= alpha <= 1, got n={n}, alpha={alpha}")
    a = alpha if kind == "sparse" else 1.0
    if one_variable:
        if kind == "dense" and arch == "ar":
            return 4 * w * (n - 1) / n
        return 2 * a * w * (n - 1)
    if kind == "sparse" and arch == "ar":
        return 2 * a * w * m * (n - 1)
    return 4 * a * w * m * (n - 1) / n


@dataclass(frozen=True)
class Decision:
    route: str
    #: bytes per machine per iteration of the way the rows would go, and of densifying
    sparse_bytes: float
    dense_bytes: float
    alpha: float
    why: str

    def describe(self, key) -> str:
        return (f"key {key!r}: {self.route} (α={self.alpha:.3f}; per machine and step "
                f"{self.sparse_bytes / 2**20:.2f} MB as rows vs {self.dense_bytes / 2**20:.2f} "
                f"MB densified; {self.why})")


def decide(alpha: float, table_bytes: float, machines: int, servers: bool,
           ar_efficiency: float = 1.0) -> Decision:
    """The route for a row_sparse key of ``table_bytes`` used at rate ``alpha`` by each of
    ``machines`` workers: rows to the servers (or gathered in the group when there are
    none), or dense when the allreduce of the whole gradient moves fewer bytes."""
    arch = "ps" if servers else "ar"
    sparse = transfer_bytes("sparse", arch, table_bytes, machines, alpha)
    dense = transfer_bytes("dense", "ar", table_bytes, machines) / ar_efficiency
    rows_route = "servers" if servers else "rows"
    if machines == 1:
        return Decision(rows_route, sparse, dense, alpha, "one machine: nothing travels")
    if dense < sparse:
        return Decision("dense", sparse, dense, alpha, "allreduce of the whole gradient wins")
    return Decision(rows_route, sparse, dense, alpha, "only the touched rows travel")
