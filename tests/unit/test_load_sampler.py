"""benchmarks/load.py's process sampler (no job runs): a process caught inside its execve
(no arguments, none of its environment yet) is named again once it can be, so the load
table never lists a scheduler or a server as a bare ``python``."""
import subprocess
import time
import types

from benchmarks import load


def test_a_process_without_arguments_is_described_by_its_name():
    inside_exec = types.SimpleNamespace(pid=2, cmdline=lambda: [], environ=lambda: {},
                                        name=lambda: "python", create_time=lambda: 0.0)
    assert load.describe(inside_exec, root=1)["role"] == "python"


def test_an_unrecognised_role_is_read_again_until_it_is_one_of_the_jobs(monkeypatch):
    # a root with one child that keeps its command line: only the re-reading names it
    root = subprocess.Popen(["bash", "-c", "sleep 30 & wait"])
    calls = {}

    def describe(proc, root_pid):
        calls[proc.pid] = calls.get(proc.pid, 0) + 1
        if proc.pid == root_pid:
            role = "launcher"
        else:   # the first look sees the image half-made, the next sees the scheduler
            role = "python" if calls[proc.pid] == 1 else "scheduler"
        return {"role": role, "client": None, "cmdline": "", "created": 0.0}

    monkeypatch.setattr(load, "describe", describe)
    sampler = load.Sampler(root.pid, interval=0.05)
    sampler.start()
    try:
        deadline = time.monotonic() + 10   # until the child is named, then 3 more rounds
        while time.monotonic() < deadline and "scheduler" not in \
                [info["role"] for info in list(sampler.info.values())]:
            time.sleep(0.05)
        rounds = len(sampler.load)
        while time.monotonic() < deadline and len(sampler.load) < rounds + 3:
            time.sleep(0.05)
    finally:
        sampler.done.set()
        sampler.join(5)
        subprocess.run(["pkill", "-P", str(root.pid)])
        root.kill()
        root.wait()
    roles = sorted(info["role"] for info in sampler.info.values())
    assert roles == ["launcher", "scheduler"], sampler.info
    child = next(pid for pid in sampler.info if pid != root.pid)
    assert calls[child] == 2 and calls[root.pid] == 1, calls   # named once, then left alone
