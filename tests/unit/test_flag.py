"""``engine.Flag``: the one-shot flag a step's prefetched rows and pull checks are read
through, set on another thread (the communication thread, or MXNet's)."""
import threading

from kvhybrid.tensor_collectives.engine import Flag


def test_a_flag_starts_unset_and_stays_set():
    flag = Flag()
    assert not flag.is_set()
    assert flag.wait(0.01) is False   # (a wait that runs out says so)
    flag.set()
    assert flag.is_set() and flag.wait(0.01) is True and flag.wait() is True


def test_a_waiter_wakes_when_another_thread_sets_its_flag():
    flag, other = Flag(), Flag()
    seen = []

    def wait():   # as the store's readers wait: in a loop (another flag's set wakes it too)
        seen.append(any(flag.wait(1) for _ in range(30)))

    waiter = threading.Thread(target=wait)
    waiter.start()
    other.set()
    flag.set()
    waiter.join(60)
    assert not waiter.is_alive() and seen == [True]


def test_a_waiter_on_an_unset_flag_is_not_fooled_by_another_flag():
    flag, other = Flag(), Flag()
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(flag.wait(0.5)))
    waiter.start()
    other.set()
    waiter.join(30)
    assert seen == [False] and not flag.is_set()
