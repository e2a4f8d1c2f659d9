"""KVHYBRID_* settings: parsed, and a bad one names the variable and a value that works."""
import pytest

from kvhybrid.config import StoreConfig
from kvhybrid.errors import ConfigError


def test_defaults_and_values():
    assert StoreConfig.from_env({}).allreduce == "auto"
    c = StoreConfig.from_env({"KVHYBRID_ALLREDUCE": " Ring ", "KVHYBRID_EMULATE_NODE_SIZE": "2",
                              "KVHYBRID_TIMEOUT": "30"})
    assert (c.allreduce, c.emulate_node_size, c.timeout) == ("ring", 2, 30.0)


@pytest.mark.parametrize("var, value, hint", [
    ("KVHYBRID_ALLREDUCE", "nccl", "auto or one of mpi, ring, shm, hierarchical"),
    ("KVHYBRID_EMULATE_NODE_SIZE", "-1", "integer >= 0"),
    ("KVHYBRID_TIMEOUT", "soon", "seconds > 0"),
    ("KVHYBRID_ABORT_ON_ERROR", "maybe", "1 or 0"),
    ("KVHYBRID_ROW_MASTERS", "rack", "set it to group"),
])
def test_bad_value_names_variable_and_fix(var, value, hint):
    with pytest.raises(ConfigError) as err:
        StoreConfig.from_env({var: value})
    assert var in str(err.value) and hint in str(err.value)
