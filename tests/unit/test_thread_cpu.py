"""The benchmarks' CPU per thread role (benchmarks/cpu.py): a thread's CPU is the scheduler's
own count, finer than the kernel's 10 ms tick, and lands under the thread's role."""
import os
import threading
import time

import pytest

from benchmarks.cpu import thread_seconds

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
    reason="this kernel keeps no per-thread schedstat (CONFIG_SCHED_INFO): the figures fall "
           "back to its ticks")


def test_a_communication_threads_cpu_is_counted_to_well_under_a_tick():
    spent, done = [], threading.Event()

    def burn():   # 23 ms of CPU (not a whole number of ticks), then stay alive to be read
        start = time.thread_time()
        while time.thread_time() - start < 0.023:
            pass
        spent.append(time.thread_time())
        done.wait()

    thread = threading.Thread(target=burn, name="kvhybrid-comm-test")
    before = thread_seconds()
    thread.start()
    while not spent:
        time.sleep(0.001)
    after = thread_seconds()
    done.set()
    thread.join()
    assert abs((after["communication"] - before["communication"]) - spent[0]) < 0.002
