"""Whether a group's host barrier wakes to make MPI progress (a job across hosts), decided
alike on every rank when the group is made: a rank told by its launcher that the job spans
hosts turns it on for all. Then meetings, some ranks late, still hold every rank.

argv: OUT SPANS_RANK. SPANS_RANK: a rank whose launcher variables say another rank runs on
another host (-1: none). Rank r writes ``OUT/rank<r>.json``.
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from kvhybrid.tensor_collectives.group import Group, GroupSettings
from kvhybrid.tensor_collectives.ops import allreduce_patiently

out, spans = Path(sys.argv[1]), int(sys.argv[2])
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
if rank == spans:
    os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"
group = Group.world(GroupSettings(timeout=60))
record = {"naps": group._barrier is not None and group._barrier._progress is not None}
sums = []
for i in range(6):
    if rank == i % group.size:
        time.sleep(0.01)   # (longer than the first nap: the others wake and probe)
    total = np.array([rank + 1.0 + i])
    allreduce_patiently(total, "sum", group, "the test's sum")
    sums.append(float(total[0]))
record["sums"] = sums
(out / f"rank{rank}.json").write_text(json.dumps(record))
