"""Who sums where: this rank's client group, the ranks whose rows one master exchanges
with the servers, the link to the servers (a master's), and the group's place among the
client groups.

- **group**: the ranks of one ``mpirun`` job (a client group, MXNET-MPI Fig. 4/5); dense
  gradients are summed over it with MPI;
- **row group**: the ranks whose row_sparse gradients one master aggregates and exchanges
  with the servers: the whole group, or with ``KVHYBRID_ROW_MASTERS=host`` this rank's
  host (Parallax's local aggregation per machine);
- **servers**: the row group's master is a ps-lite worker (``ps/link.py``); the others
  hold None;
- **sum_across_groups**: with several client groups, dense sums meet on the servers
  (unless the mode says otherwise: elastic groups meet through centers).
"""
from __future__ import annotations

from typing import Dict, Optional

from ..config import StoreConfig
from ..errors import ConfigError, KVHybridError
from ..tensor_collectives import Group
from ..tensor_collectives.group import GroupSettings
from ..tensor_collectives.topology import Topology
from .keys import Key, KeySlot
from .modes import SyncMode
from .ps.link import ServerLink, server_link


class Placement:
    """Built once per store: the groups, the servers' link and the client groups' layout.
    Refuses settings that cannot work, on every rank, before anything connects."""

    def __init__(self, config: StoreConfig, mode: SyncMode, store_name: str):
        self.config, self.mode = config, mode
        #: this client group: the ranks of one mpirun job
        self.group = Group.world(GroupSettings(config.timeout, config.stall_warning,
                                               config.allreduce, config.emulate_node_size),
                                 config.allow_singleton, config.abort_on_error)
        host_masters = self._check_row_masters(store_name)
        #: rows are aggregated per host (KVHYBRID_ROW_MASTERS=host)
        self.host_masters = host_masters
        #: whether dense sums go across client groups, through the servers
        self.sum_across_groups = mode.sums_across_groups(config.num_clients > 1
                                                         and not host_masters)
        #: the ranks whose row_sparse gradients one master aggregates and exchanges with the
        #: servers: the whole group, or this rank's host
        self.row_group = self._host_group() if host_masters else self.group
        #: this rank's link to the servers: the row group's master's, else None
        self.servers: Optional[ServerLink] = None
        ps_rank = 0
        if config.num_servers > 0 and self.row_group.rank == 0:
            self.servers = server_link(self.row_group.watchdog, config.connect_timeout,
                                       mode.server_mode, config.num_servers,
                                       rejoin=config.restart > 0, pack_keys=config.pack_keys)
            ps_rank = self.servers.ps_rank
        #: this client group's place among the groups, and how many there are
        self.client_rank, self.num_clients = ((0, 1) if host_masters
                                              else self._agree_on_clients(ps_rank))
        #: some table's rows live on the servers (see ``servers_in_step``)
        self.rows_at_servers = False

    # -- where keys live ----------------------------------------------------------------------
    def rows_on_servers(self, slot: KeySlot) -> bool:
        """Whether a key that carries rows keeps them on the servers (``sparse.py``)."""
        return not self.mode.tables_in_groups and rows_live_on_servers(
            slot, self.config.num_servers, self.sum_across_groups)

    @property
    def dense_on_servers(self) -> bool:
        """Whether dense keys also live on the servers (summed across client groups there)."""
        return self.mode.dense_on_servers(self.sum_across_groups)

    def check_new_on_servers(self, key: Key) -> None:
        if self.dense_on_servers and self.servers is not None:
            self.servers.check_new(key)

    def note_rows(self, slots: Dict[Key, KeySlot]) -> None:
        """Keep ``rows_at_servers`` current after a table moved or was added."""
        self.rows_at_servers = any(s.rows_on_servers for s in slots.values())

    def servers_in_step(self, dense_on_engine: bool) -> bool:
        """Whether a step has a rank talk to the servers while the others wait for it (several
        groups, or rows on the servers): the group's agreements then wait without spinning
        (``wait_patiently``), which leaves the cores to that rank and the servers. So do
        they on the engine path, where the engine computes while the ranks meet."""
        return self.sum_across_groups or self.rows_at_servers or dense_on_engine

    @property
    def rank(self) -> int:
        """This worker's rank among all workers of all client groups."""
        return self.client_rank * self.group.size + self.group.rank

    @property
    def num_workers(self) -> int:
        """All workers of all client groups (groups have equal sizes)."""
        return self.num_clients * self.group.size

    # -- set-up ---------------------------------------------------------------------------------
    def _check_row_masters(self, store_name: str) -> bool:
        """Whether rows are aggregated per host; refuses settings that cannot work."""
        if self.config.row_masters != "host":
            return False
        if self.config.num_servers == 0:
            raise ConfigError("KVHYBRID_ROW_MASTERS=host sends each host's rows to the parameter "
                              "servers, and this job has none: add servers (kvhybrid-launch "
                              "--servers 1 or more) or unset KVHYBRID_ROW_MASTERS")
        refusal = self.mode.allows_host_masters()
        if refusal is not None:
            raise ConfigError(f"{refusal}, not {store_name}: unset it (kvhybrid-launch sets it "
                              "when one client group spans several hosts: pass kvhybrid-launch "
                              "--row-masters group)")
        return True

    def _host_group(self) -> Group:
        """This rank's host (KVHYBRID_EMULATE_NODE_SIZE emulates hosts), checked against the
        number of ps-lite workers: one per host."""
        with self.group.watchdog.waiting("the ranks to map their hosts"):
            topology = Topology.of(self.group.MPI, self.group.comm, self.config.emulate_node_size)
        hosts = topology.nodes
        if topology.cross is not None:
            topology.cross.Free()
        if hosts != self.config.num_clients:
            raise ConfigError(f"KVHYBRID_ROW_MASTERS=host makes each of the group's {hosts} hosts "
                              f"a ps-lite worker, but DMLC_NUM_WORKER is "
                              f"{self.config.num_clients}: set DMLC_NUM_WORKER={hosts} "
                              "(kvhybrid-launch --row-masters host does) and run one client "
                              "group")
        group = self.group.derived(topology.node, "host")   # a duplicate
        topology.node.Free()
        return group

    def _agree_on_clients(self, ps_rank: int):
        """Every rank learns its group's place among the groups (the master's ps-lite rank)."""
        masters = self.servers.num_masters if self.servers else self.config.num_clients
        with self.group.watchdog.waiting("the group master to connect to the parameter servers"):
            ps_rank, masters = self.group.comm.bcast((ps_rank, masters), root=0)
        if masters != self.config.num_clients:
            raise KVHybridError(f"ps-lite has {masters} workers but DMLC_NUM_WORKER says "
                                f"{self.config.num_clients}: every client group's master must "
                                "connect to the same scheduler")
        return ps_rank, masters

    def close(self) -> None:
        """Close the groups (the process's server link stays for later stores, holding no
        table of this one's)."""
        if self.servers is not None:
            self.servers.forget()
        self.servers = None
        if self.row_group is not self.group:
            self.row_group.close()
        self.group.close()


def rows_live_on_servers(slot: KeySlot, num_servers: int, across_groups: bool) -> bool:
    """Where a key's rows live (the two kinds of key: ``sparse.py``): on the servers for
    sparse weights whenever there are servers, and for dense weights with sparse gradients
    when several client groups share them; otherwise in the group."""
    if num_servers == 0:
        return False
    return slot.sparse_weight or across_groups
