"""MXNET-MPI §7's experiments: one model trained under the six modes (dist-SGD, dist-ASGD,
dist-ESGD, mpi-SGD, mpi-ASGD, mpi-ESGD) through the launcher; validation accuracy against
wall time and epochs, and mean epoch time. ``python -m experiments --help`` from the
repository's root (not installed with kvhybrid).
"""
import benchmarks as _benchmarks  # noqa: F401  (the repository on the jobs' PYTHONPATH)
