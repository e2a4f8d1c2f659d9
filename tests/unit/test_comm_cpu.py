"""benchmarks/comm_cpu.py's wrappers (no jobs run): every call it times still exists (a
renamed function would drop its row without a word), a job is labelled by its kind, and
only the communication threads' calls count; ``--perf``'s report is read and split by
code as the table says, and where perf is missing or may not sample the fix is named."""
import os
import sys
import threading
import types

import pytest

from benchmarks.comm_cpu import QUEUES, TIMED, job_kind, on_communication_thread
from benchmarks.cpu import COMMUNICATION_THREAD
from benchmarks.caller_cpu import Tally
from benchmarks.common import resolve


@pytest.mark.parametrize("module,path,label", TIMED + [
    ("kvhybrid.tensor_collectives.engine", path, "queue") for path, _ in QUEUES])
def test_every_timed_call_exists(module, path, label):
    import kvhybrid  # noqa: F401
    assert callable(resolve(module, path)[2]), (module, path)


def test_the_queues_take_the_work_where_the_wrapper_looks_for_it():
    import inspect
    from kvhybrid.tensor_collectives.engine import EngineComm
    for path, position in QUEUES:
        names = list(inspect.signature(getattr(EngineComm, path.split(".")[1])).parameters)
        assert names[position + 1] == "work", (path, names)   # (after self and the name)


@pytest.mark.parametrize("name,kind", [
    ("bucket 0 (keys 5..0)", "bucket"),
    ("bucket 12", "bucket"),
    ("the check of the prefetched rows of key 6", "the check"),
    ("the prefetched rows of key(s) 6, 7", "the prefetched rows"),
    ("the agreement on pushpull of key [5, 4]", "the agreement on pushpull"),
])
def test_a_job_is_labelled_by_its_kind(name, kind):
    assert job_kind(name) == kind


def test_only_the_communication_threads_calls_count():
    fake = types.ModuleType("fake_comm")
    fake.work = lambda: None
    sys.modules["fake_comm"] = fake
    try:
        tally = Tally(counts=on_communication_thread)
        tally.wrap("fake_comm", "work", "work")
        fake.work()   # the main thread: not counted
        for name in (f"{COMMUNICATION_THREAD}-world", "another"):
            thread = threading.Thread(target=fake.work, name=name)
            thread.start()
            thread.join()
        assert tally.calls["work"] == 1
    finally:
        del sys.modules["fake_comm"]


# -- --perf: the thread's CPU by the code it runs ----------------------------------------
from benchmarks import comm_cpu   # noqa: E402

REPORT = """\
# Total Lost Samples: 0
#
# Samples: 5K of event 'cpu-clock:ppp'
# Overhead  Shared Object
# ........  ....................................
#
    42.50%  libpython3.11.so.1.0
    27.50%  [kernel.kallsyms]
    10.00%  libc.so.6
     8.00%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so
     4.00%  mca_pml_ob1.so
     3.00%  libmxnet.so
     2.00%  _rows.cpython-311-x86_64-linux-gnu.so
     1.50%  MPI.openmpi.cpython-311-x86_64-linux-gnu.so
     1.00%  libstdc++.so.6.0.30
     0.50%  [unknown]
"""


def test_perf_report_rows_are_read_by_shared_object():
    shares = comm_cpu.shares_by_object(REPORT)
    assert shares["libpython3.11.so.1.0"] == 42.5
    assert shares["[kernel.kallsyms]"] == 27.5
    assert len(shares) == 10 and sum(shares.values()) == 100.0


def test_each_shared_object_counts_for_its_code():
    own = {"_rows.cpython-311-x86_64-linux-gnu.so"}
    split = comm_cpu.split_by_library(comm_cpu.shares_by_object(REPORT), 2000.0, own)
    python = [label for label, _ in comm_cpu.LIBRARIES if "Python" in label][0]
    kernel, mpi = comm_cpu.LIBRARIES[0][0], comm_cpu.LIBRARIES[1][0]
    # the interpreter, numpy and mpi4py; kvhybrid's own extension module is not Python
    assert split[python] == pytest.approx(2000 * (42.5 + 8 + 1.5) / 100)
    assert split[comm_cpu.OWN_CODE] == pytest.approx(2000 * 0.02)
    assert split[kernel] == pytest.approx(2000 * 0.275)
    assert split[mpi] == pytest.approx(2000 * 0.04)
    assert split[comm_cpu.OTHER_CODE] == pytest.approx(2000 * 0.015)
    assert sum(split.values()) == pytest.approx(2000)


def test_kvhybrids_own_helpers_are_found_in_the_package():
    names = comm_cpu.own_modules()
    assert all(n.endswith(".so") for n in names)
    assert any(n.startswith("_rows.") for n in names), names


def test_a_recording_without_samples_says_so():
    with pytest.raises(RuntimeError, match="no samples"):
        comm_cpu.split_by_library({}, 1000.0, set())


def test_perf_missing_is_named_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(comm_cpu.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        comm_cpu.main(["--models", "lm", "--perf"])
    assert "apt install linux-perf" in capsys.readouterr().err


def _refusing_perf(tmp_path, monkeypatch) -> None:
    """A ``perf`` first on the PATH that exits at once as the kernel's refusal does."""
    fake = tmp_path / "perf"
    fake.write_text("#!/bin/sh\necho 'Access to performance monitoring is limited' >&2\n"
                    "exit 255\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_a_perf_refused_is_named_with_the_fix_before_anything_runs(tmp_path, monkeypatch,
                                                                   capsys):
    _refusing_perf(tmp_path, monkeypatch)
    with pytest.raises(SystemExit):
        comm_cpu.main(["--models", "lm", "--perf"])
    err = capsys.readouterr().err
    assert "performance monitoring is limited" in err and "perf_event_paranoid" in err, err


def test_a_perf_that_stops_while_recording_is_named_with_the_fix(tmp_path, monkeypatch):
    """perf record exits at once where the kernel refuses it; the worker says why and how
    to allow it, instead of an empty table later."""
    _refusing_perf(tmp_path, monkeypatch)
    proc = comm_cpu.start_perf([threading.get_native_id()], str(tmp_path / "perf.data"))
    proc.wait(timeout=10)
    with pytest.raises(RuntimeError, match="performance monitoring is limited.*"
                                           "perf_event_paranoid"):
        comm_cpu.stop_perf(proc, str(tmp_path / "perf.data"))
