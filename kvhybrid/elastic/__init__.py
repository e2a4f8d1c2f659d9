"""Elastic averaging SGD (mpi-ESGD, MXNET-MPI §2.2): ``mx.kv.create('hybrid-mpi-elastic')``.

``center.py`` is the servers' half (Elastic1), ``client.py`` the clients' half
(Elastic2), ``mode.py`` the store's elastic mode that runs them every
KVHYBRID_ELASTIC_INTERVAL steps (``kvstore/modes.py``), ``store.py`` the store class.
mpi-ASGD is ``hybrid-mpi-async`` (kvhybrid.kvstore).
"""
