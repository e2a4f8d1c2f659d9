"""``broadcast_parameters``: make every rank start from rank ``root``'s weights.

``gluon.Trainer`` broadcasts weights through the store only at its first
``step()``, after the first backward pass, so ranks that initialised their
weights differently compute the first gradients on different weights. Call
this once after initialisation (as with Horovod's function of the same name),
or seed every rank's initialiser identically.
"""
from __future__ import annotations

from typing import Union

from mxnet.gluon import ParameterDict

from ..errors import KeyValueError
from ..tensor_collectives import broadcast
from ..kvstore.calls import agree
from ..kvstore.keys import OWN_KEYS
from ..kvstore.store import HybridMPIStore


#: Prefix of the store keys that carry parameters across client groups (kvhybrid's own: a
#: Trainer's int keys may follow them in the same store)
PREFIX = f"{OWN_KEYS}broadcast_parameters:"


def broadcast_parameters(params: Union[ParameterDict, dict], store: HybridMPIStore,
                         root: int = 0) -> None:
    """Overwrite every parameter on every rank and device with rank ``root``'s value."""
    # A sparse weight (row_sparse) takes rank 0's table from the store when the Trainer
    # initialises it, and every forward pass pulls its rows from there.
    items = sorted((name, p) for name, p in params.items() if p._stype == "default")
    error = None
    try:
        if not isinstance(store, HybridMPIStore):
            raise KeyValueError(f"store must be a hybrid-mpi store, got {type(store).__name__}")
        deferred = [name for name, p in items if p._deferred_init or p._data is None]
        if deferred:
            raise KeyValueError(f"parameters {deferred[:3]} are not initialised yet: call "
                                "net.initialize() and run one forward pass before "
                                "broadcast_parameters")
        signature = [(name, p.shape, str(p.dtype)) for name, p in items]
    except KeyValueError as exc:
        error, signature = str(exc), None
    agree(store.group, "broadcast_parameters", signature, error)
    if store.num_workers > store.group.size:
        # Several client groups: through the servers, under keys of their own.
        if root != 0:
            raise KeyValueError("with several client groups broadcast_parameters takes rank 0's "
                                "weights: call it with root=0")
        for name, p in items:
            data = p.list_data()
            store.broadcast(f"{PREFIX}{name}", data[0], out=data)
        return
    for _, p in items:
        broadcast(p.list_data(), src=root, group=store.group)
