"""Routing a row_sparse key by α: Parallax Table 3's byte counts and the decision they give."""
import pytest

from kvhybrid.kvstore.routing import decide, transfer_bytes

W, N, A, M = 1000.0, 4, 0.25, 3


@pytest.mark.parametrize("kind, arch, one, expected", [
    ("dense", "ps", True, 2 * W * (N - 1)),
    ("dense", "ar", True, 4 * W * (N - 1) / N),
    ("sparse", "ps", True, 2 * A * W * (N - 1)),
    ("sparse", "ar", True, 2 * A * W * (N - 1)),
    ("dense", "ps", False, 4 * W * M * (N - 1) / N),
    ("dense", "ar", False, 4 * W * M * (N - 1) / N),
    ("sparse", "ps", False, 4 * A * W * M * (N - 1) / N),
    ("sparse", "ar", False, 2 * A * W * M * (N - 1)),
])
def test_transfer_bytes_are_table_3(kind, arch, one, expected):
    assert transfer_bytes(kind, arch, W, N, A, M, one_variable=one) == pytest.approx(expected)


@pytest.mark.parametrize("machines", [3, 4, 8])
def test_without_servers_dense_wins_once_alpha_exceeds_2_over_n(machines):
    # rows by Allgatherv: 2αw(N-1); densified allreduce: 4w(N-1)/N
    edge = 2 / machines
    below = decide(edge * 0.9, W, machines, servers=False)
    above = decide(edge * 1.1, W, machines, servers=False)
    assert (below.route, above.route) == ("rows", "dense")
    assert below.sparse_bytes == pytest.approx(2 * edge * 0.9 * W * (machines - 1))
    assert above.dense_bytes == pytest.approx(4 * W * (machines - 1) / machines)


def test_two_machines_tie_at_alpha_1_and_keep_the_rows():
    assert decide(1.0, W, 2, servers=False).route == "rows"


def test_with_servers_rows_stay_there_unless_allreduce_is_more_efficient():
    for alpha in (0.01, 0.5, 1.0):
        assert decide(alpha, W, 4, servers=True).route == "servers"
    # a byte moving 10x faster by allreduce: dense once α > 1/10
    assert decide(0.09, W, 4, servers=True, ar_efficiency=10).route == "servers"
    assert decide(0.11, W, 4, servers=True, ar_efficiency=10).route == "dense"


def test_one_machine_keeps_the_rows_and_the_decision_explains_itself():
    d = decide(1.0, W, 1, servers=False)
    assert d.route == "rows" and "one machine" in d.why
    text = decide(0.9, 2**20, 4, servers=False).describe("embed")
    assert "'embed'" in text and "α=0.900" in text and "MB" in text


@pytest.mark.parametrize("args", [("dense", "xx", W, 4), ("sparse", "ps", W, 0),
                                  ("sparse", "ps", W, 4, 1.5)])
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValueError):
        transfer_bytes(*args)
