"""MXNET-MPI §7's experiments: one model trained under the six modes (dist-SGD, dist-ASGD,
dist-ESGD, mpi-SGD, mpi-ASGD, mpi-ESGD) through the launcher; validation accuracy against
wall time and epochs, and mean epoch time. ``python -m kvhybrid.experiments --help``.
"""
