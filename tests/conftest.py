"""The tests are a package (``tests.unit``, ``tests.mpi``, ``tests.support``): pytest puts the
repository's root first on ``sys.path``, and the jobs the tests start get it on PYTHONPATH
(``tests/support/jobs.py``), so every helper is imported by its full name."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
# the suite runs the C++ helpers' paths and numpy's itself, each test choosing: a caller's
# KVHYBRID_CPP_HELPER=0 would turn the helpers' tests into tests of numpy
os.environ.pop("KVHYBRID_CPP_HELPER", None)
