"""How large a sum a group makes in its host barrier's meeting (meeting_sum.py): its slots
must fit a container's shared memory whatever the group's size. The sums themselves run on
real ranks: tests/mpi/test_host_barrier.py and test_algorithms.py."""
from kvhybrid.tensor_collectives.meeting_sum import CAPACITY, WINDOW_BYTES, capacity


def test_a_groups_meeting_slots_fit_the_shared_memory_budget():
    assert capacity(2) == capacity(4) == CAPACITY == 2**20
    for ranks in (8, 12, 16):
        assert 256 * 2**10 <= capacity(ranks) < CAPACITY
        assert 2 * (ranks + 1) * capacity(ranks) <= WINDOW_BYTES
        assert capacity(ranks) % 4096 == 0
    # (never below the 256 KB the engine path's small sums always took there)
    assert capacity(32) == capacity(256) == 256 * 2**10
