"""The doors MXNet users come in by: a store named by a string (as they name ``dist_sync``)
in ``gluon.Trainer``, ``Module.fit`` and ``Module.init_optimizer``, and ranks that ran
different numbers of batches. Real mpirun jobs, real ps-lite servers."""
import json

import pytest

from tests.support.jobs import run_job, run_launcher

APIS = ("trainer", "fit", "init_optimizer")


def _results(out, name: str, api: str, ranks: int):
    return [json.loads((out / f"{name}-{api}-rank{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def by_name(tmp_path_factory):
    out = tmp_path_factory.mktemp("by-name")
    r = run_job(2, "store_by_name.py", [out, "hybrid-mpi,hybrid-mpi-async", ",".join(APIS)],
                timeout=180)
    assert r.returncode == 0, r.output[-4000:]
    return out


# rank r's gradient is r + 1: the sum over both ranks is 3, and Module scales it by
# 1 / (batch x workers) in a synchronous store (a 'dist' and '_sync' type), as with dist_sync
@pytest.mark.parametrize("name, store, moved", [
    ("hybrid-mpi", "HybridMPIStore", {"trainer": 0.3, "fit": 0.15, "init_optimizer": 0.15}),
    ("hybrid-mpi-async", "HybridMPIAsyncStore", dict.fromkeys(APIS, 0.3))])
@pytest.mark.parametrize("api", APIS)
def test_a_store_named_by_string_trains_every_rank_through_it(by_name, name, store, moved, api):
    # without the store each rank would train alone: -0.1 on rank 0, -0.2 on rank 1
    for got in _results(by_name, name, api, 2):
        assert got["store"] == store and got["workers"] == 2 and got["steps"] == 1, got
        assert got["weights"] == pytest.approx([-moved[api]] * 2), got


@pytest.mark.parametrize("api", APIS)
def test_the_elastic_store_named_by_string_is_the_trainers(api, tmp_path):
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "store_by_name.py",
                     [tmp_path, "hybrid-mpi-elastic", api], timeout=120)
    assert r.returncode == 0, r.output[-4000:]
    for got in _results(tmp_path, "hybrid-mpi-elastic", api, 2):   # (its step pushed there)
        assert got["store"] == "HybridMPIElasticStore" and got["workers"] == 2, got
        assert got["steps"] == 1, got


#: (workers, client groups, servers): the shapes whose ranks meet in MPI groups (a group
#: per worker meets only on the servers, which wait for every group's push as dist_sync's do)
UNEVEN = {"pure-mpi": (2, 1, 0), "1group-1server": (2, 1, 1), "2groups-1server": (4, 2, 1)}


@pytest.mark.parametrize("shape", sorted(UNEVEN))
def test_ranks_with_different_numbers_of_batches_are_told_so(shape):
    # rank 0 runs 17 batches and the others 16, then each scores and saves (pulls of every
    # row): the job ends within the harness's 30 s, saying so in the user's terms
    workers, clients, servers = UNEVEN[shape]
    r = run_launcher(["-n", workers, "--clients", clients, "--servers", servers],
                     "uneven_batches.py", [16], timeout=30)
    assert r.returncode != 0, r.output[-3000:]
    said = [line for line in r.output.splitlines() if "different training steps" in line]
    clients_said = {line.split("]")[0] for line in said if line.startswith("[client ")}
    assert len(clients_said) == 1, said   # the group of the rank that ran more batches
    # the rank that waits says it; with servers the others' pulls fail with it too (in pure
    # MPI a rank that ran fewer batches may close before the other posts its later step)
    for rank in range(1 if servers == 0 else workers // clients):
        assert any(line.startswith(f"{next(iter(clients_said))}] [1,{rank}]<stderr>:")
                   for line in said), (rank, r.output[-4000:])
    for words in ("rank 0 at step 17", "at step 16", "they ran different numbers of batches",
                  "Give every rank the same number of batches"):
        assert all(words in line for line in said), said
