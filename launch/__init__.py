"""kvhybrid's launcher (``kvhybrid-launch``): sizes a job and starts its scheduler, parameter
servers and one ``mpirun`` per client group, on this machine or over ssh or Slurm, then
supervises them (one failure ends the job, naming the process).

Installed as ``kvhybrid.launch``. It imports no MXNet and no MPI (``import kvhybrid`` is
light), so it starts in a fraction of a second; the tuner imports the store's parts only
when ``--tune-partitions`` is given.
"""
