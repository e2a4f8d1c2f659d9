"""Tensor allreduce and broadcast equal numpy's results, under real mpirun.

dtypes float16/32/64, int32/64, uint8; sizes 0, 1, odd, not divisible by the
number of ranks; 1 and 2 devices per rank; the zero-copy host path and the
staging path that arrays on an accelerator take; and the store's fused pushpull of many keys
in one call (several buckets, mixed dtypes, in place and into out); and the row exchange
of a group master, whose messages pack several arrays of mixed dtypes (in the host's shared
memory, and by MPI where a message does not fit or a rank may still read its slot).
"""
import json

import pytest

from tests.support.jobs import run_job


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda p: f"{p}ranks")
def results(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("coll") / "results.json"
    job = run_job(request.param, "collectives.py", [out], timeout=240)
    assert job.returncode == 0, job.output[-4000:]
    return json.load(open(out))


def test_every_case_matches_numpy(results):
    assert len(results) > 250, f"only {len(results)} cases ran"
    bad = {name: r["err"] for name, r in results.items() if not r["ok"]}
    assert not bad, f"{len(bad)} cases differ from numpy: {dict(list(bad.items())[:10])}"


def test_fused_pushpull_matches_numpy_in_several_buckets(results):
    """Host arrays, and arrays taken for accelerator ones (staged through pinned memory)."""
    fused = {name: r for name, r in results.items() if name.startswith("fused-")}
    assert len(fused) > 200, f"only {len(fused)} fused cases ran"
    for where in ("host", "staged"):
        assert any(name.startswith(f"fused-{where}-") for name in fused), where
    assert all(r["ok"] for r in fused.values()), \
        {n: r["err"] for n, r in fused.items() if not r["ok"]}


@pytest.mark.parametrize("path", ["direct", "staged"])
def test_both_data_paths_ran(results, path):
    assert any(f"-{path}-" in name for name in results)


def test_row_exchange_packs_arrays_of_mixed_dtypes_into_one_message_each_way(results):
    """``gather_patiently`` (int64 ids, float16 rows of a 2-D row shape, float32 rows; lengths
    differing by rank, one empty) and ``scatter_bytes`` (a message of its own length to each
    rank): every array arrives intact, in rank order, with each rank's length."""
    rows = {name: r for name, r in results.items() if name.startswith("rows-")}
    assert sorted(rows) == ["rows-gather-position0", "rows-gather-position1",
                            "rows-gather-position2", "rows-gather_elsewhere_none",
                            "rows-scatter"], sorted(rows)
    assert all(r["ok"] for r in rows.values()), rows


def test_row_exchange_goes_through_shared_memory_and_by_mpi_where_it_must(results):
    """On one host the gathers and scatters go through the meeting's slots, round after
    round (both sets of gather slots in turn); a rank's message larger than its slot sends
    every rank's by MPI, and so does a scatter with no meeting since the last one (a rank
    may still read its slot). Every way delivers the same bytes; every rank took the same."""
    assert all(results[f"slots-{case}"]["ok"] for case in (
        "round1", "round2", "round3", "too_big", "scatter-first-in-a-row",
        "scatter-second-in-a-row")), {n: r for n, r in results.items() if n.startswith("slots-")}
    paths = results["slots-paths"]
    assert paths["ok"], "the ranks took different ways"
    in_slots = [{"gather": 1, "scatter": 1}, {"gather": 0, "scatter": 0}]
    by_mpi = [{"gather": 0, "scatter": 0}, {"gather": 1, "scatter": 1}]
    assert paths["paths"] == [in_slots] * 3 + [by_mpi] + [{"by_mpi_in_a_row": 1}], paths
