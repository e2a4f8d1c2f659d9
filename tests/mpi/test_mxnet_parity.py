"""hybrid-mpi does what MXNet's own distributed kvstore test asks of dist_sync
(tests/mpi/workers/mxnet_parity.py), in every launcher shape: float16 rows, pulls cast into
the out's dtype, MXNet's test optimizer on the servers' row_sparse weights, 2bit gradient
compression, MXNetError on bad calls, row_sparse outs skipped by pull (and
filled with every row without ignore_sparse, as MXNet's local stores do); and every optimizer
MXNet registers updates row_sparse weights on the servers as MXNet's own server does."""
import json

import numpy as np
import pytest

from tests.support.jobs import run_launcher

from kvhybrid.tensor_collectives.compression import CompressionParams, pack, quantize, unpack
from kvhybrid.errors import KeyValueError


SHAPES = {"pure-mpi": ["-n", 2], "1group-1server": ["-n", 2, "--servers", 1],
          "2groups-2servers": ["-n", 4, "--clients", 2, "--servers", 2],
          "4groups-1server": ["-n", 4, "--clients", 4, "--servers", 1]}


@pytest.mark.parametrize("mode,least", [("rows", 20), ("compression", 25)])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_mxnet_dist_sync_checks_pass(tmp_path, shape, mode, least):
    args = [tmp_path, mode] + (["pure-ps"] if shape == "4groups-1server" else [])
    r = run_launcher(SHAPES[shape], "mxnet_parity.py", args, timeout=300)
    assert r.returncode == 0, r.output[-3000:]
    for rank in range(SHAPES[shape][1]):
        checks = json.loads((tmp_path / f"parity-{mode}-rank{rank}.json").read_text())
        failed = {name: detail for name, (ok, detail) in checks.items() if not ok}
        assert not failed, f"rank {rank}: {failed}"
        assert len(checks) >= least, sorted(checks)


@pytest.mark.parametrize("shape", [s for s in SHAPES if "server" in s])
def test_every_builtin_optimizer_updates_row_sparse_weights_on_the_servers(tmp_path, shape):
    """tests/mpi/workers/server_optimizers.py: each registered optimizer (SGLD's noise aside)
    and SGD with an lr_scheduler, set with set_optimizer on a row_sparse key, against the
    optimizer applied in one process as MXNet's server applies it."""
    r = run_launcher(SHAPES[shape], "server_optimizers.py", [tmp_path], timeout=300)
    assert r.returncode == 0, r.output[-3000:]
    for rank in range(SHAPES[shape][1]):
        results = json.loads((tmp_path / f"optimizers-rank{rank}.json").read_text())
        failed = {name: detail for name, (ok, detail) in results.items() if not ok}
        assert not failed, f"rank {rank}: {failed}"
        assert {"test", "nadam", "adam", "ftrl", "sgd+lr_scheduler"} <= set(results)


def test_quantize_is_mxnets_2bit_with_error_feedback():
    residual = np.zeros(5, np.float32)
    codes = quantize(np.array([0.4, 0.6, -0.5, -0.2, 0.0], np.float32), residual, 0.5)
    assert codes.tolist() == [0, 1, 2, 0, 0]
    assert np.allclose(residual, [0.4, 0.1, 0.0, -0.2, 0.0])
    codes = quantize(np.array([0.1, 0.0, 0.0, -0.3, 0.0], np.float32), residual, 0.5)
    assert codes.tolist() == [1, 0, 0, 2, 0]          # the residual carried them over
    assert np.allclose(residual, [0.0, 0.1, 0.0, 0.0, 0.0], atol=1e-7)


@pytest.mark.parametrize("count", [1, 4, 7, 33])
def test_codes_pack_four_to_a_byte_and_back(count):
    codes = np.random.RandomState(count).randint(0, 3, count).astype(np.uint8)
    packed = pack(codes)
    assert packed.nbytes == -(-count // 4)
    assert unpack(packed, count).tolist() == codes.tolist()


@pytest.mark.parametrize("params,message", [
    ({"type": "1bit"}, "supports '2bit'"),
    ({"threshold": 0.5}, "needs a dict with a 'type'"),
    ({"type": "2bit", "threshold": -1}, "threshold must be a number > 0"),
    ({"type": "2bit", "threshold": "x"}, "threshold must be a number > 0"),
    ({"type": "2bit", "ratio": 2}, "takes 'type' and 'threshold' only"),
])
def test_bad_compression_params_name_the_fix(params, message):
    with pytest.raises(KeyValueError, match=message):
        CompressionParams.parse(params)
    assert CompressionParams.parse({"type": "2bit"}).threshold == 0.5
