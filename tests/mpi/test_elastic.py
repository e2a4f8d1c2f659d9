"""Elastic averaging (mpi-ESGD): both halves against numpy, and client groups pulled toward
a common center by real parameter servers."""
import json
import re
import sys

import numpy as np
import mxnet as mx
import pytest

from kvhybrid.config import StoreConfig
from kvhybrid.elastic.center import center_optimizer
from kvhybrid.elastic.client import pull_toward_center
from kvhybrid.errors import ConfigError
from tests.support.jobs import ROOT, _run_killable, run_job, run_launcher

DIM = 5


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
def test_server_half_is_elastic1(alpha):
    """The servers' update of the center: w̃ ← w̃ + α(w − w̃)."""
    rng = np.random.RandomState(0)
    center, w = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    weight = mx.nd.array(center)
    mx.optimizer.get_updater(center_optimizer(alpha))(3, mx.nd.array(w), weight)
    np.testing.assert_allclose(weight.asnumpy(), center + alpha * (w - center), rtol=1e-6)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
def test_client_half_is_elastic2(alpha):
    rng = np.random.RandomState(1)
    w, center = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    weight = mx.nd.array(w)
    pull_toward_center(weight, mx.nd.array(center), alpha)
    np.testing.assert_allclose(weight.asnumpy(), w - alpha * (w - center), rtol=1e-6)


def simulate(steps, lr, alpha, interval, target):
    """One client alone with the center, in numpy."""
    w, center, out = np.zeros(DIM), np.zeros(DIM), []
    for step in range(1, steps + 1):
        w = w - lr * (w - target)
        if step % interval == 0:
            center = center + alpha * (w - center)
            w = w - alpha * (w - center)
        out.append(w.copy())
    return np.array(out)


def test_one_group_follows_the_theory_step_by_step(tmp_path):
    env = {"KVHYBRID_ELASTIC_ALPHA": "0.3", "KVHYBRID_ELASTIC_INTERVAL": "3"}
    r = run_launcher(["-n", 2, "--clients", 1, "--servers", 1], "elastic.py", [tmp_path, 12, 0.2],
                     timeout=240, env=env)
    assert r.returncode == 0, r.output[-4000:]
    got = json.load(open(tmp_path / "client0.json"))
    assert got["exchanges"] == 4 and got["alpha"] == 0.3
    want = simulate(12, 0.2, 0.3, 3, np.ones(DIM))
    np.testing.assert_allclose(np.array(got["weights"]), want, rtol=1e-5, atol=1e-6)
    before, after = got["distances"]
    assert after == pytest.approx((1 - 0.3) * before, rel=1e-4)


def run_two_clients(tmp_path, interval):
    out = tmp_path / f"every{interval}"
    out.mkdir()
    env = {"KVHYBRID_ELASTIC_ALPHA": "0.4", "KVHYBRID_ELASTIC_INTERVAL": str(interval)}
    r = run_launcher(["-n", 2, "--clients", 2, "--servers", 1], "elastic.py", [out, 40, 0.2],
                     timeout=240, env=env)
    assert r.returncode == 0, r.output[-4000:]
    return [np.array(json.load(open(out / f"client{c}.json"))["weights"][-1]) for c in (0, 1)]


def test_two_groups_with_different_data_meet_near_a_common_center(tmp_path):
    """Client 0 is pulled to +1, client 1 to −1. Apart they end 2·sqrt(5) apart; with the
    center every step they must end much closer, on either side of 0."""
    apart = run_two_clients(tmp_path, 10**6)
    together = run_two_clients(tmp_path, 1)
    gap_apart = np.linalg.norm(apart[0] - apart[1])
    gap_together = np.linalg.norm(together[0] - together[1])
    assert gap_apart > 0.95 * 2 * np.sqrt(DIM)
    assert gap_together < 0.6 * gap_apart, (gap_together, gap_apart)
    assert (together[0] > 0).all() and (together[1] < 0).all()


@pytest.mark.parametrize("env, message", [
    ({"KVHYBRID_ELASTIC_ALPHA": "0"}, "strictly between 0 and 1"),
    ({"KVHYBRID_ELASTIC_ALPHA": "1.5"}, "strictly between 0 and 1"),
    ({"KVHYBRID_ELASTIC_INTERVAL": "0"}, "whole number of steps >= 1"),
])
def test_bad_settings_are_refused(env, message):
    with pytest.raises(ConfigError, match=message):
        StoreConfig.from_env(env)


def test_elastic_without_servers_fails_on_every_rank_before_training(tmp_path):
    r = run_job(2, "elastic.py", [tmp_path, 3, 0.1])
    assert r.returncode != 0
    assert r.output.count("this job has none: start it with servers") >= 2, r.output[-3000:]


def test_the_main_example_trains_with_elastic_averaging(tmp_path):
    """The documented way in: kvhybrid-launch ... examples/train_mlp.py --store hybrid-mpi-elastic."""
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", "4", "--clients", "2", "--servers",
           "1", "python", str(ROOT / "examples" / "train_mlp.py"), "--store", "hybrid-mpi-elastic",
           "--epochs", "2", "--samples", "8192"]
    r = _run_killable(cmd, "the elastic main job", 240, {"KVHYBRID_ELASTIC_INTERVAL": "8"})
    assert r.returncode == 0, r.output[-4000:]
    assert "hybrid-mpi-elastic: 4 workers in 2 client group(s)" in r.output
    assert "weights identical on the 2 ranks of this client group: yes" in r.output
    accuracy = [float(a) for a in re.findall(r"accuracy ([\d.]+)", r.output)]
    assert accuracy and accuracy[-1] > 0.3, r.output[-2000:]   # 10 classes: chance is 0.1
