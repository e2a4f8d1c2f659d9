"""The store's patient waits for non-blocking MPI calls on a real job whose last rank is
late: every rank gets the collective's result and its requests complete, whether the C++
helper waits (the GIL let go, handing back to Python between its calls) or Python does, with
Open MPI's requests (pointers) and MPICH's (integers)."""
import json
import subprocess
import sys

import pytest

from kvhybrid.tensor_collectives import ops
from tests.support.jobs import WORKERS, job_env, run_job
from tests.support.other_mpis import MPICH


def _assert_every_rank_got_its_result(folder, ranks):
    got = [json.loads((folder / f"rank{k}.json").read_text()) for k in range(ranks)]
    total = ranks * (ranks + 1) / 2
    for rank, g in enumerate(got):
        for case in ("helper", "python", "long"):
            assert g[case]["sum"] == [total] * 5 and g[case]["done"], (case, g[case])
        assert g["several"]["data"] == [0.0, 1.0, 2.0, 3.0] and g["several"]["done"], g
        # the helper waited wherever it was built, Python where it was not or was off
        assert g["built"] is (ops._WAIT.library() is not None), g
        helped = [(g[c]["helper"] > 0, g[c]["python"]) for c in ("helper", "long", "several")]
        assert helped == [(True, 0)] * 3 if g["built"] else [(False, 1)] * 3, g
        assert (g["python"]["helper"], g["python"]["python"]) == (0, 1), g
        if g["built"] and rank < ranks - 1:   # (a rank that waited for the late one)
            assert g["long"]["helper"] > 1, g   # back in Python between its calls


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_gets_the_result_of_a_wait_on_a_late_rank(tmp_path, ranks):
    r = run_job(ranks, "patient_waits.py", [tmp_path], timeout=90)
    assert r.returncode == 0, r.output[-3000:]
    _assert_every_rank_got_its_result(tmp_path, ranks)


@MPICH.needed
def test_the_waits_work_on_mpich_requests(tmp_path):
    r = subprocess.run([str(MPICH.mpirun), "-n", "2", sys.executable,
                        str(WORKERS / "patient_waits.py"), str(tmp_path)],
                       env={**job_env(), **MPICH.env()}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    _assert_every_rank_got_its_result(tmp_path, 2)
