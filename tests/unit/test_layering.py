"""The rooms keep to themselves: checked on the source, so a shortcut through another
module's insides fails here instead of breaking later, silently."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvhybrid"


def _tree(relative: str) -> ast.AST:
    return ast.parse((PACKAGE / relative).read_text())


def test_checkpoints_use_only_the_stores_public_resume_api():
    # a rename inside the store must not silently break resume (store.resume_state() is the API)
    private = sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(_tree("gluon/checkpoint.py"))
                      if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                      and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                      and node.value.id in ("store", "state", "links")})
    assert private == []


def test_the_collectives_import_nothing_of_the_store_or_its_settings():
    # tensor_collectives/ takes plain arguments (GroupSettings), so it can be used and
    # tested without the store, and config can name its algorithms without an import cycle;
    # the package's error types (kvhybrid.errors) are shared by all
    imported = set()
    for path in (PACKAGE / "tensor_collectives").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = (node.module or "") if node.level == 0 else \
                    "kvhybrid." + (node.module or "") if node.level == 2 else ""
                if module.startswith(("kvhybrid.kvstore", "kvhybrid.config", "kvhybrid.elastic")):
                    imported.add(f"{path.name}: {module}")
    assert imported == set()


def _private_reaches(relative_dir: str):
    """``name._attr`` where ``name`` is not self or cls: one object reading another's insides."""
    found = []
    for path in sorted((PACKAGE / relative_dir).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                owner = ast.unparse(node.value)
                if owner not in ("self", "cls"):
                    found.append(f"{path.name}:{node.lineno} {owner}.{node.attr}")
    return found


def test_the_stores_parts_use_each_other_only_through_public_names():
    # placement, calls, dense, sparse, modes, elastic: a part that reads another's private
    # state couples them silently (the old store shared _cross, _slots, _memo, _servers, ...);
    # the exceptions are MXNet's own: the registry wraps its command sender and its store
    # factory (model._create_kvstore, which Trainer and Module call), and the flat
    # SGD update keeps the bookkeeping every MXNet optimizer's update makes (update counts
    # for schedules, per-key learning rates and weight decays)
    mxnet_own = ("KVStore._send_command_to_servers", "._create_kvstore",
                 "opt._update_count", "opt._get_lrs", "opt._get_wds")
    found = [f for f in _private_reaches("kvstore") + _private_reaches("elastic")
             if not any(name in f for name in mxnet_own)]
    assert found == []


def _kvstore_imports(name: str) -> set:
    """The kvhybrid.kvstore modules ``kvstore/name.py`` imports (relative imports)."""
    found = set()
    for node in ast.walk(_tree(f"kvstore/{name}.py")):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_the_row_sparse_modules_import_one_way():
    # the store asks the push, the push asks the tables, the tables ask the pull: never back
    # (a pull that imported the push would let a pull start a push's exchange)
    assert not _kvstore_imports("sparse_pull") & {"sparse", "sparse_push", "store"}
    assert not _kvstore_imports("sparse") & {"sparse_push", "store"}
    assert not _kvstore_imports("sparse_push") & {"store"}
    assert {"sparse", "sparse_pull"} <= _kvstore_imports("sparse_push")


def test_the_stores_differ_only_by_their_mode():
    # sync, async and elastic are strategy objects (kvstore/modes.py, elastic/mode.py): their
    # store classes override no method, and no part tests a mode by its name
    for relative, names in (("kvstore/store.py", {"HybridMPIAsyncStore"}),
                            ("elastic/store.py", {"HybridMPIElasticStore"})):
        classes = [n for n in ast.walk(_tree(relative))
                   if isinstance(n, ast.ClassDef) and n.name in names]
        assert [c.name for c in classes] == sorted(names)
        for cls in classes:
            methods = [f.name for f in cls.body if isinstance(f, ast.FunctionDef)
                       and not any(isinstance(d, ast.Name) and d.id == "property"
                                   for d in f.decorator_list)]
            assert methods == [], f"{cls.name} overrides {methods}"
    for part in ("store.py", "placement.py", "calls.py", "dense.py", "sparse.py",
                 "sparse_push.py", "sparse_pull.py"):
        text = (PACKAGE / "kvstore" / part).read_text()
        assert '"dist_sync"' not in text and '"dist_async"' not in text, part


def test_the_store_is_a_thin_layer():
    # the MXNet API over its parts; the work lives in the parts (a few hundred lines)
    lines = len((PACKAGE / "kvstore" / "store.py").read_text().splitlines())
    assert lines < 600, f"kvstore/store.py has {lines} lines: move the work into a part"


def test_no_pickled_allreduce_anywhere_in_the_package():
    # mpi4py's pickled comm.allreduce(obj) holds the GIL while it waits for the other ranks
    # (checked: another thread of the process stops for the whole wait). With the store's
    # communication thread, MXNet's engine callbacks and the watchdog in the same process,
    # a rank waiting there stops all three: two ranks waiting in it on different threads
    # deadlocked a benchmark's first step, and no watchdog could report it. Buffer
    # allreduces (Allreduce, Iallreduce) release the GIL.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "allreduce" \
                    and ast.unparse(node.func.value).endswith(("comm", "COMM_WORLD")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
