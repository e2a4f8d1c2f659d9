"""``train_sparse.py``, but exits 3 in a job with parameter servers (the launcher sets
DMLC_NUM_SERVER for their workers): a shape that ``kvhybrid-launch --tune`` must skip.

argv: as train_sparse.py
"""
import os
import runpy
import sys

if os.environ.get("DMLC_NUM_SERVER"):
    print("this job cannot run with parameter servers", file=sys.stderr, flush=True)
    sys.exit(3)
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_sparse.py"),
               run_name="__main__")
