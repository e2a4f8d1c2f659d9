"""The rooms keep to themselves: checked on the source, so a shortcut through another
module's insides fails here instead of breaking later, silently."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvhybrid"


def _tree(relative: str) -> ast.AST:
    return ast.parse((PACKAGE / relative).read_text())


def test_checkpoints_use_only_the_stores_public_resume_api():
    # a rename inside the store must not silently break resume (store.resume_state() is the API)
    private = sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(_tree("kvstore/checkpoint.py"))
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
