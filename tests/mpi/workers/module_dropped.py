"""examples/train_sparse_module.py's ``main``, then a collection of the garbage its return
left (its Module and store, which refer to each other), then exit: a program that drops its
store without closing it, at whatever point Python's collector would have run.

argv: the example's arguments.
"""
import gc
import importlib.util
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_sparse_module.py"
spec = importlib.util.spec_from_file_location("train_sparse_module", EXAMPLE)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
example.main(sys.argv[1:])
gc.collect()
