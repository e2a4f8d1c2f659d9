"""The tests are a package (``tests.unit``, ``tests.mpi``, ``tests.support``): pytest puts the
repository's root first on ``sys.path``, and the jobs the tests start get it on PYTHONPATH
(``tests/support/jobs.py``), so every helper is imported by its full name."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
