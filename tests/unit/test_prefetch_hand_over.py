"""A group of one rank's prefetched rows: a hand-over that fails reaches the reader as an
error naming the key, instead of rows it would wait for until the watchdog's limit."""
import collections
import types

import numpy as np
import mxnet as mx

from kvhybrid.kvstore import sparse_push
from kvhybrid.kvstore.sparse_pull import Prefetch


def test_a_failed_hand_over_sets_ready_with_an_error_naming_the_key():
    slot = types.SimpleNamespace(shape=(10, 2), dtype=np.dtype(np.float32))
    # a dense gradient where a row_sparse one belongs: its ids cannot be read in place
    push = sparse_push.PushOfRows("emb", slot, [mx.nd.zeros((10, 2))], None, np.array([1, 3]))
    out = mx.nd.zeros((10, 2))
    prefetch = Prefetch("emb", None, None, out)
    group = types.SimpleNamespace(bytes_sent=collections.Counter())
    ended = []
    sparse_push._hand_over(push, prefetch, out, group, lambda: ended.append(True))
    assert prefetch.ready.is_set() and ended == [True]   # nothing left waiting, no timer left
    assert prefetch.error is not None and "'emb'" in prefetch.error
    assert "kvhybrid.prefetch" in prefetch.error   # what to do about it
