"""Zero-copy host views of NDArray memory (one process; no MPI involved)."""
import gc
import sys

import numpy as np
import mxnet as mx
import pytest

from kvhybrid.tensor_collectives.ndarray_view import host_view, is_host, wait_to_write


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "uint8"])
def test_view_shares_memory_both_ways(dtype):
    arr = mx.nd.arange(12, dtype=dtype).reshape((3, 4))
    wait_to_write(arr)
    view = host_view(arr)
    assert view.dtype == np.dtype(dtype) and view.shape == (12,)
    assert view.tolist() == list(range(12))
    view[5] = 42                      # a write through the view shows in the NDArray
    assert arr.asnumpy().reshape(-1)[5] == 42
    arr[:] = 7                        # and an engine write shows in the view, once waited for
    wait_to_write(arr)
    assert set(view.tolist()) == {7}


def test_view_keeps_its_ndarray_alive():
    # Otherwise a view of a temporary NDArray points into freed memory (heap corruption).
    arr = mx.nd.ones((1000,))
    wait_to_write(arr)
    before = sys.getrefcount(arr)
    view = host_view(arr)
    assert sys.getrefcount(arr) == before + 1, "the view holds no reference to its NDArray"
    del view
    gc.collect()
    assert sys.getrefcount(arr) == before


def test_empty_and_non_host_arrays():
    assert host_view(mx.nd.array(np.zeros(0))).size == 0
    assert is_host(mx.nd.zeros((1,), ctx=mx.cpu_pinned(0)))
    with pytest.raises(ValueError, match="dense"):
        host_view(mx.nd.zeros((4, 2)).tostype("row_sparse"))
