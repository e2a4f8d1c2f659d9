"""The sleeping barrier of a group whose ranks share a host (host_barrier.py), in real
jobs: it holds every rank until the last arrives, lets the others of a broadcast go only
once the root posted, makes small sums in its meeting, and is used on every rank or on
none."""
import json

import pytest

from kvhybrid.tensor_collectives import host_barrier
from tests.support.jobs import run_job

pytestmark = pytest.mark.skipif(
    host_barrier._functions() is None,
    reason="the host barrier's helper was not built (pip install --no-build-isolation -e .)")


def _records(tmp_path, n):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize("ranks", [2, 3])
def test_no_rank_leaves_the_barrier_before_the_last_arrives(tmp_path, ranks):
    r = run_job(ranks, "host_barrier.py", [tmp_path], timeout=90)
    assert r.returncode == 0, r.output[-3000:]
    got = _records(tmp_path, ranks)
    assert all(g["used"] for g in got)
    last = max(g["arrived"] for g in got)
    assert all(g["left"] >= last for g in got)
    assert all(g["sum"] == ranks * (ranks + 1) / 2 for g in got)
    root = got[-1]
    assert all(g["received"] >= root["posted"] for g in got[:-1])
    assert all(g["broadcast"] == [ranks - 1.0] * 4 for g in got)
    assert all(g["agreeing"] == [True, False] for g in got)   # rank 0's differed: all know
    # rank 0 agreed on a call where the others met for another collective: all raised the
    # same error at once, naming what each rank was doing
    mixed = {g["mixed"] for g in got}
    assert len(mixed) == 1 and None not in mixed, mixed
    text = mixed.pop()
    for words in ["pushpull of key 0 differs between ranks", "rank 0 called pushpull key 0",
                  *[f"rank {r} called the test's sum on rank {r}" for r in range(1, ranks)]]:
        assert words in text, text
    # what each rank brought, read alike by all; a check of prefetched rows decides there
    assert all(g["brought"] == [-(1 << 63) + r for r in range(ranks)] for g in got)
    assert all(g["verdicts"] == [False, True] for g in got)   # rank 0 missed its rows
    checked = {g["check_mixed"] for g in got}
    assert len(checked) == 1 and None not in checked, checked
    text = checked.pop()
    for words in ["row_sparse_pull differs between ranks",
                  "rank 0 called row_sparse_pull key 'w'",
                  *[f"rank {r} called the test's sum on rank {r}" for r in range(1, ranks)]]:
        assert words in text, text
    # sums made in the meeting, exact on every rank, both sets of slots in turn, the large
    # ones also sliced among the ranks
    assert all(g["meeting_sums"] == [["meeting", True]] * 12 for g in got), got[0]["meeting_sums"]
    assert all(g["sliced"] for g in got)
    summed = {g["sum_mixed"] for g in got}
    assert len(summed) == 1 and None not in summed, summed
    text = summed.pop()
    for words in ["differs between ranks",
                  *[f"rank {r} called the test's sum on rank {r}" for r in range(ranks)]]:
        assert words in text, text
    # rank 0 gathered rows in the meeting (meeting_rows.py) where the others met for
    # another collective: every rank raised the same error
    gathered = {g["gather_mixed"] for g in got}
    assert len(gathered) == 1 and None not in gathered, gathered
    text = gathered.pop()
    for words in ["differs between ranks",
                  *[f"rank {r} called the test's sum on rank {r}" for r in range(ranks)]]:
        assert words in text, text


def test_a_rank_without_it_turns_it_off_on_every_rank(tmp_path):
    r = run_job(2, "host_barrier.py", [tmp_path, 1], timeout=90)
    assert r.returncode == 0, r.output[-3000:]
    got = _records(tmp_path, 2)
    assert [g["used"] for g in got] == [False, False]
    assert all(g["sum"] == 3.0 and g["broadcast"] == [1.0] * 4 for g in got)
    assert all(g["agreeing"] == [None, None] for g in got)   # agree by a collective then
    assert all(g["mixed"] is None for g in got)   # (no meeting: nothing to differ in)
    assert all(g["brought"] is None for g in got)
    assert all(g["verdicts"] == [False, True] for g in got)   # (by an allreduce then)
    assert all(g["meeting_sums"] is None for g in got)   # (small sums go to MPI then)
    assert all(g["gather_mixed"] is None for g in got)


@pytest.mark.parametrize("spans,naps", [(-1, False), (1, True)])
def test_ranks_of_a_job_across_hosts_all_wake_to_make_mpi_progress(tmp_path, spans, naps):
    # asleep, a rank cannot push what its last collective left in flight to another host
    r = run_job(3, "host_barrier_naps.py", [tmp_path, spans], timeout=90)
    assert r.returncode == 0, r.output[-3000:]
    got = _records(tmp_path, 3)
    assert [g["naps"] for g in got] == [naps] * 3
    assert all(g["sums"] == [6.0 + 3 * i for i in range(6)] for g in got)
