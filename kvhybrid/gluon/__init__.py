"""Gluon glue: what a training script uses beside ``gluon.Trainer`` and the store.

- ``trainer.py``: ``DistributedTrainer`` (gradients laid out in the store's engine buckets,
  dense keys last layer first) and ``prefetch`` (the next batch's rows, a step ahead);
- ``parameters.py``: ``broadcast_parameters`` (every rank starts from rank 0's weights);
- ``checkpoint.py``: ``save_checkpoint`` / ``load_checkpoint``, through the store's public
  ``resume_state()``.

The names load on first use (``import kvhybrid`` stays light).
"""
from .._lazy import lazy_exports as _lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "DistributedTrainer": ".trainer", "prefetch": ".trainer",
    "broadcast_parameters": ".parameters",
    "save_checkpoint": ".checkpoint", "load_checkpoint": ".checkpoint",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, list(globals()))
