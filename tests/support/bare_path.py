"""A PATH as a machine without some tools sees it: a folder of links to every program on
this PATH except those tools.

CI's machine has Slurm and OpenSSH installed (``scripts/run_tests.sh``), a user's machine
may have neither: a test that runs the launcher with ``PATH=path_without(...)`` sees the
launcher as that user does, while the rest of the machine stays as it is.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

#: Slurm's commands and daemons (the launcher only ever runs srun; Open MPI and MPICH look
#: for srun too when they think they are inside an allocation)
SLURM = re.compile(r"^(s(run|alloc|batch|control|queue|info|cancel|acct|acctmgr|attach|bcast|"
                   r"stat|share|prio|report|diag|crontab|view|trigger)|slurm\w*|munge\w*)$")
#: OpenSSH's client and server programs
SSH = re.compile(r"^(ssh|sshd|scp|sftp|ssh-\w+)$")


def path_without(folder: Path, patterns: Iterable[re.Pattern]) -> str:
    """A PATH value naming one new ``folder`` that links every program of this PATH whose
    name matches none of ``patterns`` (the first of a name wins, as a shell finds it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    patterns = list(patterns)
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = os.path.join(entry, name)
            link = folder / name
            if link.exists() or link.is_symlink() or any(p.match(name) for p in patterns):
                continue
            if os.path.isfile(target) and os.access(target, os.X_OK):
                link.symlink_to(target)
    return str(folder)
