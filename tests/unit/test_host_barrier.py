"""The host barrier's helper (host_barrier.cc) on words in this process's memory, threads
standing in for ranks: who waits for whom, timeouts, and counts that wrap."""
import ctypes
import threading
import time

import numpy as np
import pytest

from kvhybrid.tensor_collectives import host_barrier

functions = host_barrier._functions()
pytestmark = pytest.mark.skipif(
    functions is None,
    reason="the host barrier's helper was not built (pip install --no-build-isolation -e .)")
GENERATION, ANNOUNCED = host_barrier._GENERATION, host_barrier._ANNOUNCED


def _words(parties=2):
    words = np.zeros(host_barrier.window_bytes(parties) // 4, dtype=np.uint32)
    return words, ctypes.c_void_p(words.ctypes.data)


def test_a_waiter_leaves_only_after_the_last_party_arrives():
    arrive, sleep, _ = functions
    words, address = _words()
    left = []

    def party():
        seen = arrive(address, 2, 0, 0)
        while sleep(address, GENERATION, seen + 1, 0, 100_000):
            pass
        left.append(time.monotonic())

    t = threading.Thread(target=party)
    t.start()
    time.sleep(0.2)
    assert not left   # still asleep: the second party has not come
    last = time.monotonic()
    seen = arrive(address, 2, 1, 0)
    assert sleep(address, GENERATION, seen + 1, 0, 1000) == 0   # the last one: moved already
    t.join(timeout=10)
    assert left and left[0] >= last
    assert list(words[:2]) == [0, 1]   # the count reset for the next meeting, one generation


def test_a_wait_nobody_ends_returns_after_its_timeout():
    arrive, sleep, _ = functions
    words, address = _words()
    seen = arrive(address, 2, 0, 0)
    assert sleep(address, GENERATION, seen + 1, 10, 2000) == 1
    assert words[0] == 1   # still counted in: waiting again must not arrive twice


def test_the_others_of_a_one_to_many_collective_wake_when_its_root_announces():
    _, sleep, announce = functions
    words, address = _words()
    assert sleep(address, ANNOUNCED, 1, 0, 2000) == 1   # no root yet
    announce(address)
    assert sleep(address, ANNOUNCED, 1, 0, 2000) == 0
    announce(address)
    announce(address)
    assert sleep(address, ANNOUNCED, 2, 0, 2000) == 0   # a root ahead of this rank is no wait


def test_counts_compare_across_the_wrap():
    _, sleep, announce = functions
    words, address = _words()
    words[2] = 0xFFFFFFFF
    assert sleep(address, ANNOUNCED, 0, 0, 2000) == 1
    announce(address)   # wraps to 0
    assert sleep(address, ANNOUNCED, 0, 0, 2000) == 0


def test_every_party_reads_what_each_brought_in_the_row_of_its_generation():
    arrive, sleep, _ = functions
    words, address = _words(3)
    digests = words[host_barrier.HEADER_WORDS:].view(np.int64).reshape(2, 3)
    rows = {}

    def party(rank, brought):
        for digest in brought:
            seen = arrive(address, 3, rank, digest)
            while sleep(address, GENERATION, seen + 1, 0, 100_000):
                pass
            rows.setdefault(rank, []).append(digests[seen & 1].tolist())

    brought = {0: [7, -1, 5], 1: [7, 2**62 + 3, 5], 2: [7, 0, 5]}
    threads = [threading.Thread(target=party, args=(r, brought[r])) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    # every party read every party's digest of each meeting (a fast party may be in the
    # next meeting, writing the other row, while a slow one reads)
    assert all(rows[r] == [[7, 7, 7], [-1, 2**62 + 3, 0], [5, 5, 5]] for r in range(3)), rows



def test_a_rank_of_a_job_across_hosts_makes_mpi_progress_while_it_waits():
    # its last collective may have left data in flight to a rank on another host, which
    # goes only while this rank calls MPI: it probes between naps that double to the
    # longest (the helper's sleep stood in for: it times out six times, then the root came)
    arrive, _, announce = functions
    events = []

    def sleep(address, index, count, spin_us, timeout_us):
        events.append(("nap", timeout_us))
        return 1 if sum(e[0] == "nap" for e in events) <= 6 else 0

    waiter = host_barrier.HostBarrier(None, bytearray(host_barrier.window_bytes(2)), 0, 2,
                                      (arrive, sleep, announce),
                                      progress=lambda: events.append(("probe", None)))
    waiter.from_root(False)
    first, longest = host_barrier.FIRST_NAP_US, host_barrier.LONGEST_NAP_US
    naps = [min(first * 2 ** k, longest) for k in range(7)]
    assert naps[-1] == longest > naps[0]
    assert events == [e for nap in naps for e in (("nap", nap), ("probe", None))][:-1]
    # without a job across hosts it sleeps through, probing nothing
    events.clear()
    quiet = host_barrier.HostBarrier(None, bytearray(host_barrier.window_bytes(2)), 0, 2,
                                     (arrive, sleep, announce))
    quiet.from_root(False)
    assert events[0] == ("nap", host_barrier.SLEEP_US) and ("probe", None) not in events
