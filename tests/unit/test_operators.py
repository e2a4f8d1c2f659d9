"""Operators pushed with their arguments laid out once (tensor_collectives/operators.py)
make what MXNet's Python functions make (one process; no MPI involved)."""
import numpy as np
import mxnet as mx
import pytest

from kvhybrid.tensor_collectives.operators import Operator, copy


def test_sgd_update_equals_mxnets_and_follows_new_parameter_values():
    weight, grad = mx.nd.array(np.linspace(-1, 1, 12)), mx.nd.array(np.linspace(2, 3, 12))
    expected = weight.copy()
    update = Operator("sgd_update", [weight, grad], [weight], lr=0.0, wd=0.0, rescale_grad=0.5)
    for lr, wd in ((0.1, 0.0), (0.1, 0.01), (0.05, 0.01)):   # a schedule, a weight decay
        update(lr=lr, wd=wd, rescale_grad=0.5)
        mx.nd.sgd_update(expected, grad, out=expected, lr=lr, wd=wd, rescale_grad=0.5)
    assert np.array_equal(weight.asnumpy(), expected.asnumpy())


def test_a_parameter_it_was_not_built_with_is_refused_by_name():
    weight = mx.nd.ones((3,))
    update = Operator("sgd_update", [weight, weight], [weight], lr=0.1, wd=0.0)
    with pytest.raises(ValueError, match="momentum"):
        update(lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="no operator named 'sgd_updat'"):
        Operator("sgd_updat", [weight], [weight])


def test_multi_output_copy_and_row_sparse_copy():
    values = [mx.nd.array([1, 2, 3]), mx.nd.array([[4, 5], [6, 7]])]
    outs = [mx.nd.zeros((3,)), mx.nd.zeros((2, 2))]
    Operator("amp_multicast", values, outs, num_outputs=2)()
    assert [o.asnumpy().tolist() for o in outs] == [[1, 2, 3], [[4, 5], [6, 7]]]
    rows = mx.nd.sparse.row_sparse_array((np.ones((2, 3), np.float32), [1, 4]), shape=(6, 3))
    out = mx.nd.sparse.zeros("row_sparse", (6, 3))
    copy(rows, out)
    assert out.indices.asnumpy().tolist() == [1, 4]
    assert np.array_equal(out.asnumpy(), rows.asnumpy())
