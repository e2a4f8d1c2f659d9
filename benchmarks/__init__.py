"""Benchmarks that run kvhybrid side by side with its peers in one run and write their tables
and plots to ``docs/benchmarks/``: ``python -m benchmarks.<name>`` from the repository's root
(not installed with kvhybrid; ``pip install -e .[bench]`` gives what they need)."""
import os as _os

#: The repository's root. It goes first on the PYTHONPATH of every process a benchmark starts
#: (``mpirun`` and ``kvhybrid-launch`` hand ``PYTHON*`` on), so their
#: ``python -m benchmarks.<worker>`` finds this folder whatever their working directory.
ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
_path = [p for p in _os.environ.get("PYTHONPATH", "").split(_os.pathsep) if p]
if ROOT not in _path:
    _os.environ["PYTHONPATH"] = _os.pathsep.join([ROOT] + _path)
