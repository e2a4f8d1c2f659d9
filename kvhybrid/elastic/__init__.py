"""Elastic averaging SGD (mpi-ESGD) and the asynchronous modes (mpi-ASGD).

Not built yet: the synchronous store in ``kvhybrid.kvstore`` is the base it
will extend (see the project's issues).
"""
