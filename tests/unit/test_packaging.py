"""setup.py declares every package the installed code imports (pip install . must be
enough, without requirements.txt), and requirements.txt pins every one of them."""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: import name -> distribution name, where they differ
DISTRIBUTION = {"sklearn": "scikit-learn"}
#: imported only where a user opted in, and built by scripts/setup.sh (not from PyPI pins)
BUILT_SEPARATELY = {"horovod"}
#: run from the repository, never installed; what they import comes from extras
TOOLS = ("benchmarks", "experiments")


def setup_kwargs() -> dict:
    import setuptools
    captured = {}
    real = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)
    try:
        exec(compile((ROOT / "setup.py").read_text(), "setup.py", "exec"),
             {"__name__": "__main__", "__file__": str(ROOT / "setup.py")})
    finally:
        setuptools.setup = real
    return captured


def name_of(requirement: str) -> str:
    for sep in "<>=!~[ ;":
        requirement = requirement.split(sep)[0]
    return requirement.lower()


def third_party_imports() -> set:
    names = set()
    for folder in ("kvhybrid", "launch") + TOOLS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "kvhybrid"
            and n not in TOOLS}


def test_every_imported_package_is_declared():
    kw = setup_kwargs()
    declared = {name_of(r) for r in kw["install_requires"]}
    for reqs in kw["extras_require"].values():
        declared |= {name_of(r) for r in reqs}
    wanted = {DISTRIBUTION.get(n, n).lower() for n in third_party_imports()}
    assert {"mxnet", "numpy", "mpi4py", "psutil", "matplotlib"} <= wanted
    missing = sorted(wanted - declared)
    assert not missing, f"setup.py does not declare {missing}"


def test_only_the_library_and_its_launcher_are_installed():
    packages = setup_kwargs()["packages"]
    assert {"kvhybrid", "kvhybrid.kvstore", "kvhybrid.launch"} <= set(packages)
    assert [p for p in packages if p.split(".")[0] != "kvhybrid"] == []
    assert [p for p in packages if p.split(".")[1:2] in (["bench"], ["experiments"])] == []


@pytest.mark.parametrize("extra,packages", [("experiments", {"matplotlib"}),
                                            ("bench", {"matplotlib", "psutil"})])
def test_optional_features_have_extras(extra, packages):
    assert packages <= {name_of(r) for r in setup_kwargs()["extras_require"][extra]}


def test_requirements_pin_what_setup_declares():
    pinned = {name_of(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    kw = setup_kwargs()
    declared = {name_of(r) for r in kw["install_requires"]}
    for extra in ("bench", "experiments", "test"):
        declared |= {name_of(r) for r in kw["extras_require"][extra]}
    assert not declared - pinned - BUILT_SEPARATELY, sorted(declared - pinned)
