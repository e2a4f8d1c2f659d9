"""Scripts the MPI tests run under mpirun or kvhybrid-launch, and the models they share
(``models``, ``sparse_models``), which the tests import to train the same model in one process."""
