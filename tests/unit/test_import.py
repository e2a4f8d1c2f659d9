"""``import kvhybrid`` is light and still registers the stores with MXNet, whichever of the
two a script imports first; the launcher runs without MXNet. Each case is a fresh
interpreter (what is imported is process-wide state)."""
import json
import subprocess
import sys

import pytest

NAMES = ["hybrid-mpi", "dist_sync_hybrid-mpi", "hybrid-mpi-async", "dist_async_hybrid-mpi",
         "hybrid-mpi-elastic", "dist_async_hybrid-mpi-elastic"]


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_kvhybrid_loads_neither_mxnet_nor_mpi():
    seen = run("import sys, json, kvhybrid\n"
               "print(json.dumps(sorted(m for m in ('mxnet', 'mpi4py', 'numpy') "
               "if m in sys.modules)))")
    assert seen == []


def test_a_jobs_process_imports_no_scipy():
    # MXNet imports scipy wherever it is installed: 0.3 s of CPU in every process of a job
    seen = run("import sys, json, mxnet, kvhybrid\n"
               "from kvhybrid.kvstore import partition_tuner, store\n"
               "print(json.dumps(sorted(m for m in ('scipy', 'sklearn') if m in sys.modules)))")
    assert seen == []


@pytest.mark.parametrize("first", ["kvhybrid", "mxnet"])
def test_the_stores_are_filed_whichever_is_imported_first(first):
    second = "mxnet" if first == "kvhybrid" else "kvhybrid"
    seen = run(f"import json, {first}, {second}\n"
               "from mxnet.kvstore import KVStore, KVStoreBase\n"
               "print(json.dumps({'names': sorted(n for n in KVStoreBase.kv_registry "
               "if 'hybrid' in n), 'signs': getattr(KVStore._send_command_to_servers, "
               "'kvhybrid_signs', False)}))")
    assert seen == {"names": sorted(NAMES), "signs": True}


def test_a_kvhybrid_module_that_imports_mxnet_first_still_files_them():
    # the engine module imports mxnet.base while kvhybrid's import hook is waiting for it
    seen = run("import json\n"
               "from kvhybrid.tensor_collectives.engine import EngineComm\n"
               "from mxnet.kvstore import KVStoreBase\n"
               "print(json.dumps('hybrid-mpi' in KVStoreBase.kv_registry))")
    assert seen is True


def test_public_names_resolve_to_the_classes_they_name():
    seen = run("import json, kvhybrid, mxnet as mx\n"
               "from kvhybrid import DistributedTrainer, KeyValueError\n"
               "from kvhybrid.kvstore.registry import store_class\n"
               "print(json.dumps([issubclass(KeyValueError, mx.base.MXNetError), "
               "DistributedTrainer.__module__, store_class('hybrid-mpi') is "
               "kvhybrid.HybridMPIStore, sorted(n for n in kvhybrid.__all__ "
               "if not hasattr(kvhybrid, n))]))")
    assert seen == [True, "kvhybrid.gluon.trainer", True, []]


def test_the_launcher_plans_a_job_without_mxnet():
    seen = run("import sys, json, contextlib, io\n"
               "from kvhybrid.launch.cli import main\n"
               "with contextlib.redirect_stdout(io.StringIO()):\n"
               "    rc = main(['-n', '4', '--clients', '2', '--servers', '1', '--dry-run', 'true'])\n"
               "print(json.dumps([rc, 'mxnet' in sys.modules]))")
    assert seen == [0, False]


def test_a_refused_setting_is_still_an_mxnet_error():
    seen = run("import json, os\n"
               "from kvhybrid.config import StoreConfig\n"
               "try:\n"
               "    StoreConfig.from_env({'KVHYBRID_EMULATE_NODE_SIZE': 'two'})\n"
               "except Exception as exc:\n"
               "    import mxnet, kvhybrid\n"
               "    print(json.dumps([isinstance(exc, kvhybrid.ConfigError), "
               "isinstance(exc, mxnet.base.MXNetError), 'KVHYBRID_EMULATE_NODE_SIZE' in str(exc)]))")
    assert seen == [True, True, True]
