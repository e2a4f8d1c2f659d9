"""The store's modes (kvstore/modes.py, elastic/mode.py): what each decides, without MPI."""
import dataclasses

import pytest

from kvhybrid.config import StoreConfig
from kvhybrid.errors import ConfigError
from kvhybrid.kvstore.modes import AsyncMode, SyncMode
from kvhybrid.kvstore.registry import ASYNC_TYPE, ELASTIC_TYPE, TYPE
from kvhybrid.elastic.mode import ElasticMode


def _config(**changes) -> StoreConfig:
    return dataclasses.replace(StoreConfig(), **changes)


def test_the_synchronous_mode_refuses_a_restarted_group_and_says_how_to_resume():
    with pytest.raises(ConfigError, match="cannot take it back.*load_checkpoint.*hybrid-mpi-async"):
        SyncMode().configure(_config(restart=1))
    assert AsyncMode().configure(_config(restart=1)).restart == 1


def test_each_mode_names_its_servers_mode_and_store_type():
    assert (SyncMode.server_mode, SyncMode.store_type) == ("dist_sync", TYPE)
    assert (AsyncMode.server_mode, AsyncMode.store_type) == ("dist_async", ASYNC_TYPE)
    assert (ElasticMode.server_mode, ElasticMode.store_type) == ("dist_async", ELASTIC_TYPE)


def test_groups_sum_across_the_servers_except_in_the_elastic_mode():
    assert SyncMode().sums_across_groups(True) and AsyncMode().sums_across_groups(True)
    assert not ElasticMode().sums_across_groups(True)
    assert not SyncMode().sums_across_groups(False)
    # the elastic mode keeps every dense key's center on the servers, and tables in the groups
    assert ElasticMode().dense_on_servers(False) and ElasticMode.tables_in_groups
    assert not SyncMode().dense_on_servers(False) and not SyncMode.tables_in_groups


def test_only_asynchronous_groups_train_their_own_weights():
    assert not SyncMode().groups_differ(3)
    assert AsyncMode().groups_differ(3) and not AsyncMode().groups_differ(1)


def test_the_elastic_mode_needs_servers_and_runs_key_by_key():
    with pytest.raises(ConfigError, match="has none.*--servers 1"):
        ElasticMode().configure(_config(num_servers=0))
    mode = ElasticMode()
    config = mode.configure(_config(num_servers=1, elastic_interval=8))
    assert config.fusion_threshold == 0 and not mode.engine_path and mode.interval == 8


def test_only_the_synchronous_mode_takes_host_masters():
    assert SyncMode().allows_host_masters() is None
    assert "synchronous" in AsyncMode().allows_host_masters()
    assert "synchronous" in ElasticMode().allows_host_masters()
