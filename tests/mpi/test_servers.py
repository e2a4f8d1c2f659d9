"""Guards around MXNet's parameter servers (ps-lite), which fail silently or hang on their own."""
import socket

from tests.support.jobs import run_job, run_launcher


def test_unreachable_scheduler_fails_within_30_s_naming_host_and_port():
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
           "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "KVHYBRID_SECRET": "k" * 64}
    r = run_job(2, "create_store.py", timeout=90, env=env)   # default KVHYBRID_CONNECT_TIMEOUT
    assert r.returncode != 0
    assert r.seconds < 30, f"took {r.seconds:.0f} s"
    assert f"waiting for the scheduler at 127.0.0.1:{port}" in r.output
    assert "KVHYBRID_CONNECT_TIMEOUT" in r.output


def test_optimizer_the_servers_cannot_load_is_an_error_not_a_silent_sum():
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "custom_optimizer.py", timeout=120)
    assert r.returncode != 0
    assert "the parameter servers could not load the optimizer __main__.ScriptLocalSGD" in r.output
    assert "importable on the servers" in r.output
    assert "trained with an optimizer the servers cannot load" not in r.output


def test_optimizer_failing_on_a_server_ends_the_job_naming_it():
    """MXNet's server loop prints an updater's exception and carries on (the weights half
    updated, the workers none the wiser): kvhybrid's server ends instead."""
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "server_update_fails.py",
                     timeout=120)
    assert r.returncode != 0
    assert "the optimizer failed on key" in r.output and "server 0" in r.output
    assert "trained on after the servers' optimizer failed" not in r.output
    assert r.seconds < 60, f"took {r.seconds:.0f} s"
