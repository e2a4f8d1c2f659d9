"""kvhybrid's launcher (``kvhybrid-launch``): starts the MPI ranks of a job.

Installed as ``kvhybrid.launch``. So far it starts pure-MPI jobs (one client
group, no parameter servers) through the system's ``mpirun``.
"""
