"""Finding MPI: is this process part of an MPI job, and can mpi4py load?

Both questions are answered before MPI is initialised, so that a user who
runs ``python train.py`` instead of ``mpirun -np 4 python train.py`` gets an
error telling them how to launch, not a silent job of one rank.
"""
from __future__ import annotations

import os
from typing import Optional

from ..errors import NotInMPIJobError

#: Variables that MPI launchers set in every process they start.
_LAUNCHER_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI mpirun"),
    ("PMIX_RANK", "a PMIx launcher"),
    ("PMI_SIZE", "MPICH/Hydra mpiexec"),
    ("PMI_RANK", "a PMI launcher"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH mpirun"),
    ("I_MPI_HYDRA_TOPOLIB", "Intel MPI mpiexec"),
)

HOW_TO_LAUNCH = ("launch it with an MPI launcher, e.g. `mpirun -np 4 python train.py` "
                 "(or `kvhybrid-launch -n 4 python train.py`); to run one process on its own, "
                 "set KVHYBRID_ALLOW_SINGLETON=1")


def detect_launcher(environ=None) -> Optional[str]:
    """Name of the MPI launcher that started this process, or None."""
    env = os.environ if environ is None else environ
    for var, name in _LAUNCHER_VARS:
        if var in env:
            return name
    return None


def job_spans_hosts() -> bool:
    """Whether a rank of the job may run on another host than this one, as the MPI launcher
    told this process (Open MPI's, Hydra's or MVAPICH's local and world sizes); True where
    it told nothing."""
    env = os.environ
    for local, world in (("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"),
                         ("MPI_LOCALNRANKS", "PMI_SIZE"),
                         ("MV2_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_SIZE")):
        if local in env and world in env:
            return env[local] != env[world]
    return True


def load_mpi(allow_singleton: bool):
    """Return the ``mpi4py.MPI`` module, or raise :class:`NotInMPIJobError`."""
    if detect_launcher() is None and not allow_singleton:
        raise NotInMPIJobError("hybrid-mpi needs an MPI job, but this process was not started "
                               "by an MPI launcher: " + HOW_TO_LAUNCH)
    try:
        from mpi4py import MPI  # noqa: WPS433 (imported late on purpose: it initialises MPI)
    except Exception as exc:  # ImportError, or RuntimeError when libmpi cannot be loaded
        raise NotInMPIJobError(
            f"hybrid-mpi cannot load MPI ({type(exc).__name__}: {exc}): install an MPI library "
            "and mpi4py, e.g. `apt-get install openmpi-bin libopenmpi-dev && pip install mpi4py`, "
            "or run scripts/setup.sh") from exc
    return MPI
