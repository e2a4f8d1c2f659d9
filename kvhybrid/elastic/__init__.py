"""Elastic averaging SGD (mpi-ESGD, MXNET-MPI §2.2): ``mx.kv.create('hybrid-mpi-elastic')``.

``center.py`` is the servers' half (Elastic1), ``client.py`` the clients' half
(Elastic2), ``store.py`` the store that runs them every KVHYBRID_ELASTIC_INTERVAL steps.
mpi-ASGD is ``hybrid-mpi-async`` (kvhybrid.kvstore).
"""
