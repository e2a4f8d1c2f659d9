"""How client groups meet: the store's modes as strategy objects.

A mode answers every question on which the synchronous, asynchronous and elastic stores
differ, so the store itself holds no ``if mode == ...``:

- ``SyncMode`` (mpi-SGD, ``hybrid-mpi``): groups sum their dense gradients through the
  servers in ``dist_sync`` mode; every group waits for every other at every step;
- ``AsyncMode`` (mpi-ASGD, ``hybrid-mpi-async``): the same through ``dist_async``
  servers, so no group waits for another;
- ``ElasticMode`` (mpi-ESGD, ``hybrid-mpi-elastic``) lives in ``kvhybrid/elastic/mode.py``.

A mode is made from the config before anything connects (``configure`` may refuse it),
then bound to the store's placement (``bind``) once the groups are known.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

from ..config import StoreConfig
from ..errors import ConfigError
from .keys import Key, KeySlot
from .registry import ASYNC_TYPE, NAME, TYPE

if TYPE_CHECKING:   # the placement imports MPI; a mode is plain policy
    from .placement import Placement


class SyncMode:
    """mpi-SGD: synchronous inside and between client groups (``dist_sync`` servers)."""

    #: the parameter servers' mode between client groups
    server_mode = "dist_sync"
    #: what the store's ``type`` says (Gluon reads 'dist' and 'async' in it)
    store_type = TYPE
    #: whether a pushpull inside one group may take the engine path (overlap.py)
    engine_path = True
    #: whether every client group holds its own tables (their rows never live on the
    #: servers, whatever the routing rule of ``sparse.py`` says)
    tables_in_groups = False

    def configure(self, config: StoreConfig) -> StoreConfig:
        """The config this mode runs with; refuses one it cannot run, on every rank, before
        anything connects."""
        if config.restart:
            raise ConfigError(
                f"this client group was restarted (KVHYBRID_RESTART={config.restart}), and "
                f"the synchronous {NAME} store cannot take it back: the other groups and the "
                "servers wait for every group at every step, so the job is lost. Resume it "
                "from a checkpoint (kvhybrid.load_checkpoint), or train with "
                "hybrid-mpi-async or hybrid-mpi-elastic to survive a lost group")
        return config

    def allows_host_masters(self) -> Optional[str]:
        """None if KVHYBRID_ROW_MASTERS=host can run in this mode, else the refusal."""
        return None

    def bind(self, placement: "Placement") -> None:
        """Called once the client groups are known."""
        self.placement = placement

    def sums_across_groups(self, several_groups: bool) -> bool:
        """Whether the groups' dense sums meet on the servers (they do with several groups)."""
        return several_groups

    def dense_on_servers(self, sum_across_groups: bool) -> bool:
        """Whether dense keys live on the servers too (initialised there from rank 0)."""
        return sum_across_groups


    def groups_differ(self, num_clients: int) -> bool:
        """Whether each client group trains its own copy of the weights."""
        return False

    def compresses_on_servers(self) -> bool:
        """Whether a pure-PS job may hand MXNet's compressor to its servers."""
        return True

    def server_optimizer(self, optimizer):
        """What the servers run on the values they hold: the Trainer's optimizer."""
        return optimizer

    def check_update(self, has_updater: bool) -> None:
        """Refuses a dense sum this mode cannot apply (raises KeyValueError)."""

    def after_update(self, key: Key, slot: KeySlot) -> None:
        """After a key's sum was applied (the dense path, or rows summed in the group)."""

    def step_counts(self) -> Dict[Key, int]:
        """Per-key step counters that a checkpoint saves and restores in place."""
        return {}


class AsyncMode(SyncMode):
    """mpi-ASGD (MXNET-MPI §4): each group sums synchronously with MPI, and the groups meet
    on ``dist_async`` servers: a master pushes its sum and pulls the current weights
    without waiting for the other groups. With one group it is the synchronous mode."""

    server_mode = "dist_async"
    store_type = ASYNC_TYPE

    def configure(self, config: StoreConfig) -> StoreConfig:
        return config   # a restarted group rejoins: nobody waits for it

    def allows_host_masters(self) -> Optional[str]:
        return "KVHYBRID_ROW_MASTERS=host is for the synchronous hybrid-mpi store"

    def groups_differ(self, num_clients: int) -> bool:
        return num_clients > 1

    def compresses_on_servers(self) -> bool:
        return False
