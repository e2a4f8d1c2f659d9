"""Building the ``mpirun`` command line for Open MPI or MPICH."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

#: Set for every rank unless the user's environment already sets it. glibc then
#: backs large allocations (MXNet's arrays, MPI's buffers) with transparent huge
#: pages: on 2 cores a 64 MB allreduce takes 13 ms instead of 29-34 ms
#: (docs/benchmarks/pushpull.md).
DEFAULT_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}

#: Open MPI's allreduce rules for kvhybrid's jobs: its own choice below 8 MB, the
#: segmented ring with 1 MB segments from 8 MB up (64 MB on 2 ranks: 13 ms instead of
#: 40 ms; forced for every size it is slower below 8 MB). Used unless the user sets any
#: ``coll_tuned`` parameter or passes --no-mpi-tuning; the path must exist on every host.
ALLREDUCE_RULES = Path(__file__).with_name("ompi_allreduce_rules.conf")

#: Variables handed to every rank when they are set here.
FORWARDED_PREFIXES = ("KVHYBRID_", "MXNET_", "OMP_", "DMLC_", "PYTHON", "GLIBC_TUNABLES",
                      "LD_LIBRARY_PATH", "PATH")


@dataclass
class MpiJob:
    num_ranks: int
    command: List[str]
    hosts: Optional[str] = None          # "a:2,b:2" (Open MPI -H / MPICH -hosts)
    hostfile: Optional[str] = None
    extra_args: List[str] = field(default_factory=list)
    #: More processes than cores on the host (other groups, servers): waiting ranks must
    #: yield the CPU instead of spinning on it (4x faster with groups + servers on 2 cores).
    crowded: bool = False
    #: add Open MPI's allreduce tuning (ALLREDUCE_RULES)
    tune_mpi: bool = True


def find_mpirun() -> str:
    path = shutil.which("mpirun") or shutil.which("mpiexec")
    if path is None:
        raise FileNotFoundError("no mpirun on PATH: install Open MPI (apt-get install openmpi-bin) "
                                "or MPICH, or run scripts/setup.sh")
    return path


def flavour(mpirun: str) -> str:
    """'openmpi' or 'mpich', from ``mpirun --version``."""
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    return "openmpi" if ("Open MPI" in out or "OpenRTE" in out) else "mpich"


def job_env(user: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    for k, v in DEFAULT_ENV.items():
        env.setdefault(k, v)
    env.update(user)
    return env


def tuning_args(env: Dict[str, str], extra_args: List[str]) -> List[str]:
    """``--mca`` arguments that make Open MPI's allreduce use ALLREDUCE_RULES, or none
    when the user tunes ``coll_tuned`` themselves (in the environment or --mpi-args)."""
    if any(k.startswith("OMPI_MCA_coll_tuned_") for k in env) or \
            any("coll_tuned_" in a for a in extra_args):
        return []
    return ["--mca", "coll_tuned_use_dynamic_rules", "1",
            "--mca", "coll_tuned_dynamic_rules_filename", str(ALLREDUCE_RULES)]


def build_command(job: MpiJob, mpirun: str, kind: str, env: Dict[str, str]) -> List[str]:
    cmd = [mpirun, "-np", str(job.num_ranks)]
    names = sorted(k for k in env if k.startswith(FORWARDED_PREFIXES))
    if kind == "openmpi":
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["--bind-to", "none", "--tag-output"]
        if job.hosts is None and job.hostfile is None and job.num_ranks > (os.cpu_count() or 1):
            cmd.append("--oversubscribe")
        if job.crowded or (job.hosts is None and job.num_ranks > (os.cpu_count() or 1)):
            cmd += ["--mca", "mpi_yield_when_idle", "1"]
        if job.hosts:
            cmd += ["-H", job.hosts]
        if job.hostfile:
            cmd += ["--hostfile", job.hostfile]
        if job.tune_mpi:
            cmd += tuning_args(env, job.extra_args)
        for name in names:
            cmd += ["-x", name]
    else:
        cmd += ["-prepend-rank"]
        if job.hosts:
            cmd += ["-hosts", job.hosts]
        if job.hostfile:
            cmd += ["-f", job.hostfile]
        cmd += ["-genvlist", ",".join(names)] if names else []
    return cmd + job.extra_args + job.command
