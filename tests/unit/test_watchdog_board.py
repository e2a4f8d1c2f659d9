"""What a watchdog's waits post on its shared-memory board (one process, its own board):
a collective wait's number, and while a wait on the servers lasts the flag that makes the
ranks waiting on this one defer their report (``OUTWARD_FACTOR``), on every open watchdog's
board; a wait inside another is covered by the outer one's guard."""
import gc

import pytest
from mpi4py import MPI

from kvhybrid.tensor_collectives import watchdog as wd


@pytest.fixture
def dogs():
    made = []

    def make(name):
        dog = wd.Watchdog(MPI, MPI.COMM_SELF, timeout=60, stall_warning=30, name=name)
        made.append(dog)
        return dog
    yield make
    for dog in made:
        dog.close()


def _slot(dog):
    return dog._board[dog.rank]


def test_a_wait_on_the_servers_is_posted_on_every_board_while_it_lasts(dogs):
    group, host = dogs("group"), dogs("host")
    assert group._board, "no shared-memory board: a stall could not name the ranks behind"
    with group.waiting("the servers", collective=False, outward=True):
        assert [_slot(d)[wd._OUTWARD] for d in (group, host)] == [1, 1]
        assert group.current == "the servers"
        with group.waiting("an inner wait", outward=True):   # (covered by the outer guard)
            assert group.current == "the servers"
        assert _slot(host)[wd._OUTWARD] == 1
    assert [_slot(d)[wd._OUTWARD] for d in (group, host)] == [0, 0]
    assert group.current is None
    with pytest.raises(RuntimeError, match="raised inside"):   # (not swallowed, and undone)
        with group.waiting("the servers", collective=False, outward=True):
            raise RuntimeError("raised inside the wait")
    assert [_slot(d)[wd._OUTWARD] for d in (group, host)] == [0, 0]
    assert group.current is None


def test_a_guard_entered_again_times_its_own_wait(dogs):
    dog = dogs("group")
    guard = dog.waiting("the rows")
    with dog.waiting("the servers", outward=True):
        with guard:   # inside: covered by the outer wait
            assert dog.current == "the servers"
    with guard:       # alone: its own wait, undone at its end
        assert dog.current == "the rows"
    assert dog.current is None


def test_collective_waits_are_numbered_on_the_board(dogs):
    dog = dogs("group")
    assert dog._board, "no shared-memory board: a stall could not name the ranks behind"
    for _ in range(3):
        with dog.waiting(lambda: "a sum"):
            pass
    with dog.waiting("the engine", collective=False):
        pass
    assert dog.collectives == 3 and _slot(dog)[wd._SEQ] == 3


def test_a_closed_or_collected_watchdog_leaves_the_posts(dogs):
    kept, closed = dogs("kept"), dogs("closed")
    assert kept._board, "no shared-memory board: a stall could not name the ranks behind"
    closed_slot = _slot(closed)
    closed.close()
    assert not any(s is closed_slot for s in wd._SLOTS)
    collected = wd.Watchdog(MPI, MPI.COMM_SELF, timeout=60, stall_warning=30, name="lost")
    collected_slot = _slot(collected)
    collected._stop.set()   # (its thread ends at its next poll and lets go of it)
    collected._thread.join(5)
    assert not collected._thread.is_alive()
    del collected
    gc.collect()
    assert not any(s is collected_slot for s in wd._SLOTS)
    assert any(s is _slot(kept) for s in wd._SLOTS)
    with kept.waiting("the servers", outward=True):
        assert closed_slot[wd._OUTWARD] == 0 and collected_slot[wd._OUTWARD] == 0
