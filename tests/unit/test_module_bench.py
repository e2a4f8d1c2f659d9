"""benchmarks.module_sparse's arithmetic: an epoch's and a checkpoint's figures from the
example's marks, and the page's ratios to dist_sync's in the same round."""
import argparse

from benchmarks import module_sparse


def test_an_epoch_and_its_checkpoint_are_read_between_the_marks_the_first_epoch_left_out():
    marks = [[1, "train", 0.0, 0.0, 0.0], [1, "checkpoint", 9.0, 9.0, 9.0],
             [1, "done", 9.5, 9.5, 9.5],
             [2, "train", 10.0, 1.0, 100.0], [2, "checkpoint", 12.0, 1.5, 103.0],
             [2, "done", 12.25, 1.6, 103.5]]
    assert module_sparse._phases(marks) == {"epoch_s": [2.0], "checkpoint_s": [0.25],
                                            "epoch_thread_cpu_s": [0.5],
                                            "epoch_machine_cpu_s": [3.0]}


def test_the_page_gives_each_shape_over_dist_sync_in_the_same_round():
    def figures(scale):
        return dict.fromkeys(module_sparse.FIGURES, scale)
    rounds = [{"2 adam": {"dist_sync": figures(2.0), "pure MPI": figures(1.0)}},
              {"2 adam": {"dist_sync": figures(4.0), "pure MPI": figures(3.0)}}]
    args = argparse.Namespace(features=1000, batches=4, epochs=3)
    page = module_sparse.report(rounds, args)
    row = next(line for line in page.splitlines() if "pure MPI" in line)
    assert row.startswith("| 2 adam | kvhybrid, pure MPI | 0.62× (0.50–0.75) |"), row
    assert "Command: `python -m benchmarks.module_sparse" in page and "Measured: " in page
