"""A bucket's SGD as one operator over flat buffers (kvhybrid/kvstore/flat_update.py): the
same weights and states as MXNet's Updater, step after step, and the Updater kept where
the flat update would differ; the C++ helper's update the operator's, to the bit. One process: the update is local arithmetic."""
import numpy as np
import mxnet as mx
import pytest

from kvhybrid.kvstore import flat_update
from kvhybrid.kvstore.flat_update import FlatSGD, fits
from kvhybrid.tensor_collectives.ndarray_view import host_view
from kvhybrid.kvstore.keys import KeySlot

SHAPES = {"dense0_weight": (6, 5), "dense0_bias": (6,), "dense1_weight": (3, 6),
          "dense1_bias": (3,)}


def _setup(seed: int, **opt_args):
    """(updater, keys, slots, flat gradient buffer, its per-key views) with random weights."""
    rng = np.random.default_rng(seed)
    keys = list(range(len(SHAPES)))
    opt = mx.optimizer.SGD(**opt_args)
    opt.idx2name = dict(zip(keys, SHAPES))      # wd_mult 0 for biases, as Gluon's
    opt.set_wd_mult({})
    updater = mx.optimizer.get_updater(opt)
    slots = [KeySlot(s, np.dtype("float32"),
                     mx.nd.array(rng.standard_normal(s), dtype="float32"))
             for s in SHAPES.values()]
    count = sum(s.count for s in slots)
    grads = mx.nd.zeros((count,))
    views, at = [], 0
    for s in slots:
        views.append(grads[at:at + s.count].reshape(s.shape))
        at += s.count
    return updater, keys, slots, grads, views


def _fill(grads: mx.nd.NDArray, step: int) -> None:
    rng = np.random.default_rng(100 + step)
    grads[:] = rng.standard_normal(grads.shape).astype(np.float32)


@pytest.mark.parametrize("opt_args", [
    lambda: {"learning_rate": 0.1},
    lambda: {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-2, "rescale_grad": 0.5},
    lambda: {"learning_rate": 0.1, "momentum": 0.9, "clip_gradient": 0.3,
             "lr_scheduler": mx.lr_scheduler.FactorScheduler(step=2, factor=0.5)},
], ids=["plain", "momentum-wd", "clip-schedule"])
def test_flat_sgd_makes_the_updaters_weights_and_states(opt_args):
    ref_updater, keys, ref_slots, ref_grads, ref_views = _setup(1, **opt_args())
    updater, _, slots, grads, _ = _setup(1, **opt_args())
    assert fits(updater, slots, grads)
    flat = FlatSGD(updater, keys, slots, grads)
    for step in range(5):
        _fill(ref_grads, step)
        _fill(grads, step)
        ref_updater(keys, ref_views, [s.value for s in ref_slots])
        assert flat.current()
        flat.update()
        for ref, got in zip(ref_slots, slots):
            np.testing.assert_allclose(got.value.asnumpy(), ref.value.asnumpy(), rtol=1e-6,
                                       atol=1e-7)
    assert updater.optimizer.num_update == ref_updater.optimizer.num_update == 5
    for k in keys:
        ref_state, state = ref_updater.states[k], updater.states[k]
        if ref_state is None:
            assert state is None
        else:
            np.testing.assert_allclose(state.asnumpy(), ref_state.asnumpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("opt_args", [
    lambda: {"learning_rate": 0.1},
    lambda: {"learning_rate": 0.1, "wd": 1e-2, "clip_gradient": 0.3},
    lambda: {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-2, "rescale_grad": 0.5},
    lambda: {"learning_rate": 0.1, "momentum": 0.9, "clip_gradient": 0.3,
             "lr_scheduler": mx.lr_scheduler.FactorScheduler(step=2, factor=0.5)},
], ids=["plain", "wd-clip", "momentum-wd", "momentum-clip-schedule"])
def test_the_cpp_update_makes_the_operators_weights_and_states(opt_args, dtype):
    # the communication thread's update (prepare, then the returned call) against the same
    # bucket's SGD operators, from the same start: the same arithmetic, to the bit
    ops_updater, keys, ops_slots, ops_grads, _ = _setup(4, **opt_args())
    updater, _, slots, grads, _ = _setup(4, **opt_args())
    if dtype == "float64":
        for ss in (ops_slots, slots):
            for s in ss:
                s.dtype, s.value = np.dtype(dtype), s.value.astype(dtype)
        ops_grads, grads = ops_grads.astype(dtype), grads.astype(dtype)
    grads.wait_to_read()
    ops = FlatSGD(ops_updater, keys, ops_slots, ops_grads)
    flat = FlatSGD(updater, keys, slots, grads, host_view(grads, grads.dtype, grads.size))
    assert ops.kernel is None and flat.kernel is not None
    for step in range(5):
        for g in (ops_grads, grads):
            _fill(g, step)
        ops.update()
        grads.wait_to_read()   # (the helper reads memory, outside MXNet's engine)
        flat.prepare()()
        for ref, got in zip(ops_slots, slots):
            np.testing.assert_array_equal(got.value.asnumpy(), ref.value.asnumpy())
    assert updater.optimizer.num_update == ops_updater.optimizer.num_update == 5
    for k in keys:
        if ops_updater.states[k] is None:
            assert updater.states[k] is None
        else:
            np.testing.assert_array_equal(updater.states[k].asnumpy(),
                                          ops_updater.states[k].asnumpy())


def test_the_cpp_update_is_left_to_operators_where_it_does_not_apply(monkeypatch):
    updater, keys, slots, grads, _ = _setup(5, learning_rate=0.1)
    grads.wait_to_read()
    view = host_view(grads, grads.dtype, grads.size)
    assert FlatSGD(updater, keys, slots, grads, view).kernel is not None
    monkeypatch.setattr(flat_update, "NATIVE_UPDATE_BYTES", view.nbytes - 4)
    assert FlatSGD(updater, keys, slots, grads, view).kernel is None   # a large bucket
    monkeypatch.setattr(flat_update._HELPER, "loaded", [None])   # not built, or switched off
    monkeypatch.setattr(flat_update, "NATIVE_UPDATE_BYTES", view.nbytes)
    assert FlatSGD(updater, keys, slots, grads, view).kernel is None
    assert flat_update.native_kernel(np.float16) is None


def test_states_loaded_in_place_of_the_views_are_copied_in_at_the_next_layout():
    updater, keys, slots, grads, _ = _setup(2, learning_rate=0.1, momentum=0.9)
    flat = FlatSGD(updater, keys, slots, grads)
    _fill(grads, 0)
    flat.update()
    saved = updater.get_states(dump_optimizer=False)
    moms = {k: updater.states[k].asnumpy() for k in keys}
    updater.set_states(saved)   # new arrays replace the views
    assert not flat.current()
    again = FlatSGD(updater, keys, slots, grads)
    assert again.current()
    for k in keys:
        np.testing.assert_allclose(updater.states[k].asnumpy(), moms[k])


def test_the_updater_stays_where_the_flat_update_would_differ():
    updater, keys, slots, grads, _ = _setup(3, learning_rate=0.1)
    assert fits(updater, slots, grads)
    adam = mx.optimizer.get_updater(mx.optimizer.Adam())
    assert not fits(adam, slots, grads)

    class MySGD(mx.optimizer.SGD):
        pass

    assert not fits(mx.optimizer.get_updater(MySGD()), slots, grads)
    half = [KeySlot(s.shape, np.dtype("float16"), s.value.astype("float16")) for s in slots]
    master = mx.optimizer.get_updater(mx.optimizer.SGD(multi_precision=True))
    assert not fits(master, half, grads.astype("float16"))
    assert not fits(updater, slots, grads.astype("float64"))   # weights of another dtype
    assert not fits(lambda *a: None, slots, grads)              # a user's updater function
