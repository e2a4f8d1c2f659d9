"""kvhybrid's tests: ``unit/`` (no MPI, seconds), ``mpi/`` (real mpirun jobs, ps-lite servers,
emulated machines; their worker scripts in ``mpi/workers/``), ``support/`` (the harness)."""
