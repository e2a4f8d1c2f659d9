"""benchmarks/step_timeline.py without a job: every point it wraps still exists, every job
label names a job the store queues, and the times line up by step around the master's
rows."""
import inspect

import pytest

from benchmarks.step_timeline import ANCHOR, JOBS, POINTS, STEP, timeline

MS = 1_000_000


@pytest.mark.parametrize("module,path,enter,leave", POINTS)
def test_every_wrapped_point_exists(module, path, enter, leave):
    import kvhybrid  # noqa: F401
    from benchmarks.common import resolve
    assert callable(resolve(module, path)[2]), (module, path)


@pytest.mark.parametrize("start,label", JOBS)
def test_every_job_label_names_a_job_the_store_queues(start, label):
    from kvhybrid.kvstore import calls, overlap, sparse_pull, sparse_push
    sources = "".join(inspect.getsource(m) for m in (calls, overlap, sparse_pull, sparse_push))
    assert f'f"{start}' in sources or f'"{start}' in sources, start


def _step(base, master_ready, other_ready, check):
    """One step's events: rank 0 (the master) and rank 1, times in ms from ``base``."""
    at = lambda ms: base + int(ms * MS)   # noqa: E731
    return {0: [(at(master_ready - 3), "hand-out: began"), (at(master_ready), ANCHOR),
                (at(check), "check: began"), (at(9), STEP)],
            1: [(at(other_ready), ANCHOR), (at(check + 1), "check: began"), (at(9.5), STEP)]}


def test_points_are_taken_from_their_own_step_relative_to_the_masters_rows():
    ranks = {0: [], 1: []}
    for k in range(6):   # rank 1's rows come just after the master's, its check 1 ms later
        for r, events in _step(k * 10 * MS, 1.0, 1.4, 3.0).items():
            ranks[r] += events
    got = timeline(ranks, warmup=1)
    assert got["step_ms"] == pytest.approx(10.0)
    assert got["medians"][ANCHOR][0] == pytest.approx(0.0)
    assert got["medians"][ANCHOR][1] == pytest.approx(0.4)        # after the master's
    assert got["medians"]["hand-out: began"][0] == pytest.approx(-3.0)   # before it
    assert got["medians"]["check: began"][1] == pytest.approx(3.0)
    assert got["labels"][0] == "hand-out: began"


def test_a_job_without_prefetched_rows_is_refused_by_name():
    with pytest.raises(SystemExit, match="prefetch_rows"):
        timeline({0: [(0, STEP), (10 * MS, STEP)]}, warmup=0)
