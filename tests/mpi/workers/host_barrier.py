"""A group's host barrier on a real job: a rank passes ``meet`` only once every rank
arrived, the others of a one-to-many collective only once its root posted, every rank
learns whether all brought the same digest (``meet_agreeing``) and what each brought
(``meet_bringing``: a check of prefetched rows decides there), small sums are made in the
meeting itself (``meeting_sum.py``), a rank that meets for another collective while others
agree on a call, check their rows, sum or gather rows raises with them, and the ranks agree
on whether to use it at all.

argv: OUT [RANK_WITHOUT]. RANK_WITHOUT: a rank that turns the barrier off
(KVHYBRID_HOST_BARRIER=0), which must turn it off on every rank. Rank r writes
``OUT/rank<r>.json``: whether the barrier was used, when it arrived and left each meeting
(``time.time()``, one host's clock), and what the collectives after it computed.
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from kvhybrid.errors import KeyValueError
from kvhybrid.kvstore.calls import PULL_CHECK, agree_in_meeting
from kvhybrid.kvstore.sparse_pull import PullCheck
from kvhybrid.tensor_collectives import meeting_sum
from kvhybrid.tensor_collectives.group import Group, GroupSettings
from kvhybrid.tensor_collectives.ops import allreduce_patiently, broadcast_view
from kvhybrid.tensor_collectives.rows import gather_patiently

out = Path(sys.argv[1])
without = int(sys.argv[2]) if len(sys.argv) > 2 else -1
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
if rank == without:
    os.environ["KVHYBRID_HOST_BARRIER"] = "0"
group = Group.world(GroupSettings(timeout=60))
record = {}

# every rank arrives 0.3 s after the one before it
time.sleep(0.3 * rank)
record["arrived"] = time.time()
record["used"] = group.meet()
record["left"] = time.time()

# a sum waited for patiently, the last rank late
if rank == group.size - 1:
    time.sleep(0.3)
total = np.array([rank + 1.0])
allreduce_patiently(total, "sum", group, "the test's sum")
record["sum"] = float(total[0])

# a broadcast from the last rank, which posts 0.5 s after the others wait for it
root = group.size - 1
view = np.full(4, float(rank))
if rank == root:
    time.sleep(0.5)
    record["posted"] = time.time()
broadcast_view(view, root, group, name="the test's array", patient=True)
record["received"] = time.time()
record["broadcast"] = view.tolist()

# an agreement in the barrier: every rank learns whether all brought the same digest
record["agreeing"] = [group.meet_agreeing(11), group.meet_agreeing(11 + (rank == 0))]

# rank 0 agrees on a call in a meeting where the others meet for another collective: the
# ranks' calls differ, and every rank raises the same error (nothing waits for a timeout)
try:
    with group.watchdog.waiting(f"the test's sum on rank {rank}"):
        if rank == 0:
            agree_in_meeting(group, "pushpull of key 0", "pushpull key 0")
        else:
            group.meet()
    record["mixed"] = None
except KeyValueError as exc:
    record["mixed"] = str(exc)

# every rank reads what each brought (a pull check's verdict needs more than "all equal")
brought = group.meet_bringing(PULL_CHECK | rank)
record["brought"] = None if brought is None else brought.tolist()


def check(covered):   # a check of prefetched rows, this rank's covered or not
    return PullCheck("w", None, "row_sparse_pull key 'w'", None, covered)


# whether some rank needs the plain pull: none, then rank 0
record["verdicts"] = [check(True).needs_plain_pull(group),
                      check(rank != 0).needs_plain_pull(group)]

# rank 0 checks its rows where the others meet for another collective: all raise at once
record["check_mixed"] = None
if group.meets_on_host:   # (without it rank 0's allreduce would wait for the timeout)
    try:
        with group.watchdog.waiting(f"the test's sum on rank {rank}"):
            if rank == 0:
                check(True).needs_plain_pull(group)
            else:
                group.meet()
    except KeyValueError as exc:
        record["check_mixed"] = str(exc)

# sums made in the meeting (meeting_sum.py), as the engine path's patient group makes small
# ones: right and exact, call after call (its two sets of slots alternate), several sizes
# and dtypes; then rank 0 sums where the others meet for another collective: all raise
record["meeting_sums"] = record["sum_mixed"] = None
if group.meets_on_host:
    group.algorithms.patient = True
    record["meeting_sums"] = []
    # (the last three up to 800 KB, which went to MPI's call before the meeting took them)
    for step, (n, dtype) in enumerate([(1, "float32"), (5003, "float32"), (5003, "float64"),
                                       (7, "int64"), (65535, "float32"), (5003, "float32"),
                                       (200003, "float32"), (40001, "float64"),
                                       (100003, "int32")]):
        def part(r):
            return (np.arange(n) % 13 + r + step).astype(dtype)
        v = part(rank)
        name = group.algorithms.allreduce(v)
        record["meeting_sums"].append([name, bool(np.array_equal(
            v, sum(part(r) for r in range(group.size))))])
    # the large ones again, sliced among the ranks (as in a group of SLICED_RANKS or more)
    meeting_sum.SLICED_RANKS = 2
    for step, (n, dtype) in enumerate([(200003, "float32"), (40001, "float64"),
                                       (100003, "int32")]):
        v = (np.arange(n) % 11 + rank + step).astype(dtype)
        name = group.algorithms.allreduce(v)
        want = sum((np.arange(n) % 11 + r + step).astype(dtype) for r in range(group.size))
        record["meeting_sums"].append([name, bool(np.array_equal(v, want))])
    # (the sliced way leaves the sum in the slots' shared result: it ran)
    sums = group.algorithms._meeting_sum
    result = sums._slots[(sums._calls - 1) & 1, -1, :v.nbytes]
    record["sliced"] = bool(np.array_equal(result.view(v.dtype), v))
    try:
        with group.watchdog.waiting(f"the test's sum on rank {rank}"):
            if rank == 0:
                group.algorithms.allreduce(np.ones(10, np.float32))
            else:
                group.meet()
    except KeyValueError as exc:
        record["sum_mixed"] = str(exc)

# rank 0 gathers rows in the meeting (meeting_rows.py) where the others meet for another
# collective: all raise at once
record["gather_mixed"] = None
if group.meets_on_host:
    try:
        with group.watchdog.waiting(f"the test's sum on rank {rank}"):
            if rank == 0:
                gather_patiently([np.arange(3)], group, name="the test's rows")
            else:
                group.meet()
    except KeyValueError as exc:
        record["gather_mixed"] = str(exc)

(out / f"rank{rank}.json").write_text(json.dumps(record))
group.close()
