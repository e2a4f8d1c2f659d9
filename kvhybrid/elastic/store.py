"""``mx.kv.create('hybrid-mpi-elastic')``: the store in its elastic-averaging mode
(``mode.py``), in a job with parameter servers."""
from __future__ import annotations

from typing import Dict, List

from ..kvstore.keys import Key
from ..kvstore.registry import ELASTIC_NAME
from ..kvstore.store import HybridMPIStore
from .mode import ElasticMode


class HybridMPIElasticStore(HybridMPIStore):
    """mpi-ESGD: synchronous SGD inside each client group, elastic averaging with a center
    variable on the servers between groups (see ``mode.py``)."""

    MODE = ElasticMode
    NAME = ELASTIC_NAME

    @property
    def alpha(self) -> float:
        """The elastic force α (KVHYBRID_ELASTIC_ALPHA, else 0.9 ÷ client groups)."""
        return self.mode.alpha

    @property
    def interval(self) -> int:
        """Steps of a key between two exchanges with its center (KVHYBRID_ELASTIC_INTERVAL)."""
        return self.mode.interval

    @property
    def exchanges(self) -> Dict[Key, int]:
        """Center exchanges made so far, per key."""
        return self.mode.exchanges

    @property
    def distances(self) -> Dict[Key, List[float]]:
        """|w − w̃| before and after each key's last exchange."""
        return self.mode.distances
