"""The benchmarks run end to end (tiny sizes) and write their table, JSON and plot.

They assert no timing: they check that every peer was measured and reported.
"""
import collections
import json
import subprocess
import sys

from tests.support.jobs import ROOT, job_env


def run_bench(module: str, tmp_path, *args) -> tuple:
    """Run ``python -m benchmarks.<module> ... --out tmp_path``; (table text, JSON)."""
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *map(str, args), "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / f"{module}.png").stat().st_size > 10_000
    return (tmp_path / f"{module}.md").read_text(), json.loads((tmp_path / f"{module}.json").read_text())


def test_pushpull_benchmark_writes_table_json_and_plot(tmp_path):
    table, results = run_bench("pushpull", tmp_path, "--sizes-mb", 0.25, "--repeats", 2,
                               "--warmup", 1, "--variants", "default")
    for column in ("hybrid-mpi pushpull", "MPI Allreduce in place", "Horovod allreduce_",
                   "dist_sync push+pull", "memcpy"):
        assert column in table
    assert {"hybrid_pushpull_inplace", "mpi_allreduce_inplace", "horovod_allreduce",
            "dist_sync_push_pull"} <= set(results["default"]["0.25"])


def test_sparse_pull_benchmark_measures_both_designs(tmp_path):
    table, results = run_bench("sparse_pull", tmp_path, "--workers", 2, "--rows", 500, "--ids", 64,
                               "--repeats", 2, "--warmup", 1)
    assert "master pulls the union, scatters" in table and "every worker pulls its rows" in table
    by_design = results["results"]["2"]
    assert set(by_design) == {"master", "every"}
    assert all(r["pull_ms"] > 0 and r["rows_per_worker"] > 0 for r in by_design.values())


def test_module_benchmark_runs_every_shape_beside_dist_sync(tmp_path):
    table, results = run_bench("module_sparse", tmp_path, "--workers", 2, "--optimizers", "adam",
                               "--rounds", 1, "--epochs", 2, "--batches", 2,
                               "--features", 5000)
    [got] = results["rounds"]
    assert set(got["2 adam"]) == {"dist_sync", "one group", "group per worker", "pure MPI"}
    assert all(v["epoch_s"] > 0 and v["epoch_machine_cpu_s"] > 0
               for v in got["2 adam"].values())
    for shape in ("one group + servers", "a group per worker + servers", "pure MPI"):
        assert f"| 2 adam | kvhybrid, {shape} |" in table


def test_fusion_benchmark_measures_every_case(tmp_path):
    table, results = run_bench("fusion", tmp_path, "--keys", 8, "--key-kb", 4, "--ranks", 2,
                               "--repeats", 2, "--warmup", 1)
    assert set(results["results"]["2"]) == {"store_per_key", "store_fused", "store_fused_views",
                                            "mpi_per_key", "mpi_one_buffer", "horovod"}
    assert "fused (one buffer) speed-up over key by key" in table


def test_waits_benchmark_times_every_way_of_waiting(tmp_path):
    table, results = run_bench("waits", tmp_path, "--rounds", 2, "--repeats", 3, "--warmup", 1,
                               "--bytes", 16, "--late-ms", 0, 1)
    assert set(results) == {f"16 {late} {way}" for late in ("0", "1")
                            for way in ("spinning", "sleeping", "polling", "host barrier",
                                        "in the barrier", "summed in the barrier")}
    assert all(len(r["wall"]) == 2 and min(r["wall"]) > 0 for r in results.values())
    assert table.count("| 16 |") == 2 and "host barrier: wall, CPU" in table
    assert "in the barrier: wall, CPU" in table and "summed in the barrier: wall, CPU" in table


def test_allreduce_benchmark_measures_every_peer_and_algorithm(tmp_path):
    table, results = run_bench("allreduce", tmp_path, "--sizes-mb", 0.5, "--ranks", 2,
                               "--repeats", 2, "--warmup", 1, "--rounds", 1)
    cols = set(results["2"]["times"]["0.5"])
    assert {"memory_copy", "memory_add", "ompi_default", "ompi_tuned", "horovod", "alg_mpi",
            "alg_ring", "alg_shm", "alg_hierarchical", "store"} <= cols, cols
    # (on one host the store's engine path sums up to 1 MB in its host barrier's meeting)
    assert results["2"]["selected"]["0.5"][0] == "meeting"
    assert "## Targets (same run)" in table and "GB/s" in table


def test_partitions_benchmark_sweeps_and_runs_the_tuner(tmp_path):
    table, results = run_bench("partitions", tmp_path, "--workers", 2, "--servers", 1,
                               "--sweep", 1, 2, "--rounds", 1, "--steps", 6, "--batch-size", 16)
    assert {"1", "2"} <= set(results["sweep"])
    tuner = results["tuner"]
    assert 3 <= len(tuner["samples"]) <= 5 and str(tuner["partitions"]) in results["sweep"]
    assert "Tuner: " in table and "the best P's" in table
    assert "## The tuner's own table and fit" in table and "t(P) = " in table
    assert not list(tmp_path.glob("partitions_tuning.*"))   # one page per benchmark


def test_models_benchmark_runs_every_system_and_they_take_the_same_steps(tmp_path):
    """Synchronous training is the same computation whoever moves the gradients: the five
    systems end with the same loss on the sparse LM-like model."""
    table, results = run_bench("models", tmp_path, "--models", "lm", "--steps", 4, "--warmup", 1,
                               "--workers", 2, "--tokens", 10)
    systems = results["lm"]
    assert set(systems) == {"kvhybrid", "kvhybrid all-AR", "kvhybrid all-PS", "dist_sync",
                            "Horovod", "compute only"}
    alone = systems.pop("compute only")   # the bound: trains alone, so ends elsewhere
    assert alone["step_seconds"] > 0 and abs(alone["loss"] - systems["kvhybrid"]["loss"]) > 1e-6
    assert set(alone["phases"]) == {"forward", "backward", "trainer.step", "waitall"}
    losses = [r["loss"] for r in systems.values()]
    assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), systems
    assert systems["kvhybrid"]["bytes_sent"]["servers"] > 0      # rows went to the servers
    assert [s["route"] for s in systems["kvhybrid all-AR"]["key_stats"].values()] == ["dense"]
    assert [s["route"] for s in systems["kvhybrid"]["key_stats"].values()] == ["servers"]
    assert "kvhybrid ÷ this" in table
    # each kvhybrid system's CPU ÷ dist_sync's, round by round (not Horovod's: a peer only)
    assert "| lm | kvhybrid all-PS | " in table and "| caller's thread CPU | machine CPU |" in table
    # loopback has no per-host link to count; Table 3's figure is there for every system
    assert "counted ÷ Table 3" in table
    assert all(r["wire_per_host"] is None and r["table3_per_host"] > 0 for r in systems.values())
    assert systems["Horovod"]["table3_per_host"] > 10 * systems["kvhybrid"]["table3_per_host"]


def test_models_benchmark_times_a_loop_that_never_waits(tmp_path):
    """--waitall end: the workers wait for MXNet's engine once, after the last step (each
    says so in its result), and the systems still take the same steps."""
    table, results = run_bench("models", tmp_path, "--models", "lm", "--steps", 6, "--warmup", 2,
                               "--workers", 2, "--tokens", 10, "--systems", "kvhybrid",
                               "dist_sync", "--waitall", "end")
    systems = results["lm"]
    assert set(systems) == {"kvhybrid", "dist_sync"}
    losses = [r["loss"] for r in systems.values()]
    assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), systems
    assert all(r["step_seconds"] > 0 and r["waitall"] == "end" for r in systems.values())
    assert "waited for MXNet's engine once, after the last step" in table
    # each system says how soon its callers' threads had queued the timed steps
    assert all(0 < r["queued_fraction"] <= 1 for r in systems.values()), systems
    assert "had queued every timed step after this share" in table


def test_load_benchmark_samples_every_process_of_both_shapes(tmp_path):
    """The load test's table lists every process of each job, each sampled while the
    steps ran (no memory figure asserted: tiny runs make noise of it)."""
    table, results = run_bench("load", tmp_path, "--keys", 200, "--steps", 10,
                               "--large-floats", 65536, "--interval", 0.2)
    expected = {"mpi": {"worker": 4, "mpirun": 1, "launcher": 1},
                "servers": {"worker": 4, "mpirun": 2, "server": 1, "scheduler": 1, "launcher": 1}}
    for shape, roles in expected.items():
        run = results[shape]
        assert run["status"] == "ok", run["output_tail"]
        processes = run["analysis"]["processes"]
        assert collections.Counter(r["role"] for r in processes) == roles, processes
        assert {r["pid"] for r in processes if r["role"] == "worker"} == \
            {w["pid"] for w in run["workers"]}
        assert all(r["samples"] >= 2 and r["after_warmup"] > 0 and r["end"] > 0 for r in processes)
        assert all(w["sums_checked"] and len(w["steps"]) == 10 for w in run["workers"])
        for r in processes:
            assert f"| {r['name']} | {r['pid']} |" in table
    assert "RSS after warm-up (MB)" in table and "## Summary" in table


def test_compression_benchmark_matches_mxnet_and_saves_bytes(tmp_path):
    """Every system trains; 2bit training through hybrid-mpi (one group, and pure PS) ends
    where MXNet's dist_sync with the same compression ends, with fewer bytes."""
    table, results = run_bench("compression", tmp_path, "--ranks", 2, "--epochs", 1,
                               "--rounds", 1, "--thresholds", 0.5)
    summary = results["summary"]
    for store in ("hybrid-mpi", "hybrid-mpi pure PS", "dist_sync"):
        for kind in ("uncompressed", "2bit, threshold 0.5"):
            assert f"| {store}, {kind} |" in table
    compressed = [summary[f"{s}, 2bit, threshold 0.5"]["loss"][0]
                  for s in ("hybrid-mpi", "hybrid-mpi pure PS", "dist_sync")]
    assert max(compressed) - min(compressed) < 1e-4, compressed
    assert summary["hybrid-mpi, 2bit, threshold 0.5"]["wire"] \
        < summary["hybrid-mpi, uncompressed"]["wire"] / 8
    assert summary["hybrid-mpi pure PS, 2bit, threshold 0.5"]["loopback"] \
        < summary["hybrid-mpi pure PS, uncompressed"]["loopback"] * 0.7


def test_ring_segments_benchmark_times_every_segment_size_on_correct_sums(tmp_path):
    # the worker fails the run if any ring's sum differs from MPI's
    table, results = run_bench("ring_segments", tmp_path, "--hosts", 0, "--ranks", 3,
                               "--sizes-mb", 0.3, "--segments-kb", 4, 64, "--rounds", 2,
                               "--repeats", 2)
    times = results["times_ms"]
    assert set(times) == {"MPI Allreduce", "ring (rule)", "ring 4 KB", "ring 64 KB"}
    assert all(len(by_size["0.3"]) == 2 and min(by_size["0.3"]) > 0 for by_size in times.values())
    assert "rule ÷ each ring" in table and "loopback, 3 ranks" in table


def test_overlap_benchmark_sets_the_engine_path_against_the_blocking_path(tmp_path):
    """With --systems naming only the two paths, the table and plot carry their ratio alone."""
    table, runs = run_bench("overlap", tmp_path, "--models", "cnn", "--systems", "kvhybrid",
                            "kvhybrid blocking", "--rounds", 1, "--steps", 3, "--warmup", 1)
    assert [set(r) for r in runs["cnn"]] == [{"kvhybrid", "kvhybrid blocking"}]
    assert "kvhybrid ÷ kvhybrid blocking" in table and "dist_sync" not in table
    assert "## Engine buckets" in table


def test_cost_benchmark_sets_every_systems_cpu_against_dist_syncs(tmp_path):
    """Every system's caller's thread and machine CPU per step measured, each round, and
    kvhybrid's set against dist_sync's of the same round (the README's status row)."""
    table, saved = run_bench("cost", tmp_path, "--models", "lm", "--workers", 2, "--rounds", 1,
                             "--steps", 6, "--warmup", 2, "--tokens", 10, "--systems",
                             "kvhybrid", "dist_sync", "compute only")
    (round_,) = saved["workers"]["2"]
    for system in ("kvhybrid", "dist_sync", "compute only"):
        run = round_["lm"][system]
        assert run["cpu_ms_per_step"]["caller"] > 0 and run["machine_cpu_ms_per_step"] > 0, run
        assert f"| lm | 2 | {system} |" in table
    (ratio,) = saved["caller_cpu_ratio"]["lm"]
    caller = {s: round_["lm"][s]["cpu_ms_per_step"]["caller"] for s in ("kvhybrid", "dist_sync")}
    assert ratio == caller["kvhybrid"] / caller["dist_sync"]
    assert "communication CPU ms / step" in table and "Command: `python -m benchmarks.cost" in table
    # --replot writes the same page from the JSON, measuring nothing
    (tmp_path / "cost.md").unlink()
    subprocess.run([sys.executable, "-m", "benchmarks.cost", "--replot", "--out", str(tmp_path)],
                   check=True, capture_output=True, env=job_env(), cwd=ROOT, timeout=120)
    assert (tmp_path / "cost.md").read_text() == table


def test_comm_cpu_benchmark_times_each_job_of_the_communication_thread(tmp_path):
    """Each kind of job the communication thread runs, and the calls inside, timed for a
    group's master and its other rank apart; the servers' calls on the master only. In a
    loop that never waits, the thread's whole CPU is read once it has run the timed
    steps' jobs, so it holds them all."""
    table, saved = run_bench("comm_cpu", tmp_path, "--models", "lm", "--workers", 2,
                             "--rounds", 1, "--steps", 12, "--warmup", 4, "--tokens", 10,
                             "--waitall", "end")
    (run,) = saved["lm"]["kvhybrid"]
    assert set(run) == {"masters", "others"}
    jobs = ("job: the prefetched rows", "job: bucket", "job: the check")
    for role in ("masters", "others"):
        us = run[role]["us_per_step"]
        for job in jobs:
            assert us.get(job, 0) > 0, (role, job, us)
        assert run[role]["total"] >= 0.9 * sum(us[job] for job in jobs), (role, run[role])
    # one push a step: the warm-up's jobs ran before the count started, the last step's
    # before it ended
    assert run["masters"]["calls_per_step"]["  the master's push to the servers"] == 1
    assert "  the master's push to the servers" not in run["others"]["us_per_step"]
    assert "| **the communication thread, all of it** |" in table
    assert "Command: `python -m benchmarks.comm_cpu" in table
