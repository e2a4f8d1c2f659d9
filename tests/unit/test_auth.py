"""The signed-command envelope (kvhybrid/kvstore/ps/auth.py): what a server accepts and what it
refuses, without unpickling anything it refuses. No MPI, no servers."""
import pickle
import time

import pytest

from kvhybrid.kvstore.ps import auth

SECRET = b"s" * 64


UNPICKLED = []


def _record():
    UNPICKLED.append(1)


class Recorder:
    """Unpickling it leaves a mark in UNPICKLED."""

    def __reduce__(self):
        return _record, ()


def test_a_signed_object_loads_back():
    assert auth.Verifier(SECRET).load(auth.sign({"lr": 0.1}, SECRET).encode()) == {"lr": 0.1}


def test_the_body_is_ascii_without_nul_since_ps_lite_hands_it_over_as_a_c_string():
    body = auth.sign(b"\x00" * 10, SECRET)
    assert body.isascii() and "\x00" not in body


@pytest.mark.parametrize("mutate, says", [
    (lambda b: pickle.dumps("x", protocol=0), "an unsigned command"),
    (lambda b: b"", "an unsigned command"),
    (lambda b: b[:-4] + b"AAAA", "another secret"),                     # payload changed
    (lambda b: b.replace(b"kvh1 ", b"kvh1 1", 1), "another secret"),    # time changed
])
def test_a_body_that_is_not_signed_with_the_secret_is_refused_unread(mutate, says):
    body = auth.sign("x", SECRET).encode()
    with pytest.raises(auth.AuthError, match=says):
        auth.Verifier(SECRET).load(mutate(body))


def test_another_secret_is_refused_before_unpickling():
    body = auth.sign(Recorder(), b"t" * 64).encode()
    with pytest.raises(auth.AuthError, match="another secret"):
        auth.Verifier(SECRET).load(body)
    assert UNPICKLED == []
    auth.Verifier(b"t" * 64).load(body)
    assert UNPICKLED == [1], "the same body with the right secret is unpickled"


def test_a_replayed_or_stale_command_is_refused():
    verifier = auth.Verifier(SECRET, max_age=5)
    body = auth.sign("x", SECRET).encode()
    verifier.load(body)
    with pytest.raises(auth.AuthError, match="seen before"):
        verifier.load(body)
    old = auth.sign("x", SECRET)
    real = time.time
    try:
        auth.time.time = lambda: real() + 60
        with pytest.raises(auth.AuthError, match="60 s ago"):
            verifier.load(old.encode())
    finally:
        auth.time.time = real


def test_the_secret_comes_from_the_variable_or_the_file(tmp_path):
    assert auth.job_secret({"KVHYBRID_SECRET": "k" * 20}) == b"k" * 20
    path = tmp_path / "secret"
    path.write_text("f" * 20 + "\n")
    assert auth.job_secret({"KVHYBRID_SECRET_FILE": str(path)}) == b"f" * 20
    with pytest.raises(auth.AuthError, match="KVHYBRID_SECRET is not set"):
        auth.job_secret({})
    with pytest.raises(auth.AuthError, match="cannot read it"):
        auth.job_secret({"KVHYBRID_SECRET_FILE": str(tmp_path / "missing")})
    with pytest.raises(auth.AuthError, match="at least 16"):
        auth.job_secret({"KVHYBRID_SECRET": "short"})


def test_a_worker_with_servers_and_no_secret_is_refused_by_the_config():
    from kvhybrid import ConfigError, StoreConfig
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1"}
    with pytest.raises(ConfigError, match="KVHYBRID_SECRET"):
        StoreConfig.from_env(env)
    assert StoreConfig.from_env({**env, "KVHYBRID_SECRET": "k" * 32}).num_servers == 1
