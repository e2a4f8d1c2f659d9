"""The words for ranks that ran different numbers of batches."""
from kvhybrid.errors import explain
from kvhybrid.tensor_collectives.watchdog import steps_differ


def test_ranks_at_one_step_say_nothing():
    assert steps_differ({0: 16, 1: 16, 2: 16}) == ""


def test_ranks_at_different_steps_are_named_with_the_fix():
    text = steps_differ({0: 17, 1: 16, 2: 16})
    assert "rank 0 at step 17; ranks 1, 2 at step 16" in text
    assert "ran different numbers of batches" in text and "same number of batches" in text


def test_calls_that_differ_at_different_steps_say_why():
    text = explain("push", [(None, "push key 'w'"), (None, "row_sparse_pull key 'w'")],
                   steps_differ({0: 17, 1: 16}))
    assert text.startswith("push differs between ranks: rank 0 called push key 'w'; rank 1 "
                           "called row_sparse_pull key 'w'. The ranks are at different "
                           "training steps (rank 0 at step 17; rank 1 at step 16")
    assert text.endswith("Every rank must make the same calls, in the same order, with the "
                         "same arguments (keys, shapes, dtypes, settings)")
