"""A row_sparse call's way through the store, traced in a real job (one group of 2 and a
server): at a loop's repeated calls, each push and pull reaches the executor (any call into
tensor_collectives) through at most three of the store's files, the API's first, on the
master and on the other rank, as docs/design.md walks it."""
import json

from tests.support.jobs import run_launcher

CALLS = ["push, prefetched", "row_sparse_pull, replayed", "row_sparse_pull, covered", "push",
         "row_sparse_pull, served", "pull of every row"]


def test_each_sparse_call_reaches_the_executor_through_at_most_three_files(tmp_path):
    r = run_launcher(["-n", 2, "--servers", 1], "call_paths.py", [tmp_path], timeout=120)
    assert r.returncode == 0, r.output[-3000:]
    for rank in range(2):   # (the master and a rank it hands rows to)
        paths = json.loads((tmp_path / f"paths-rank{rank}.json").read_text())
        assert sorted(paths) == sorted(CALLS)
        for call, seen in paths.items():
            assert seen["stacks"], f"{call} reached no executor: it entered {seen['entered']}"
            for stack in seen["stacks"]:
                assert stack[0] == "store.py" and len(stack) <= 3, \
                    (rank, call, stack, seen["entered"])
