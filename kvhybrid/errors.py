"""Exceptions kvhybrid raises. Every message names the cause and how to fix it.

Every one is an ``mx.base.MXNetError`` (a ``RuntimeError``): code written for MXNet's own
stores catches that around kvstore calls, and must catch kvhybrid's errors the same way.
"""
from mxnet.base import MXNetError


class KVHybridError(MXNetError):
    """Base class of kvhybrid's errors."""


class NotInMPIJobError(KVHybridError):
    """The store was created outside an MPI job, or MPI cannot be loaded."""


class KeyValueError(KVHybridError, ValueError):
    """A call to the store got bad input (unknown key, wrong shape, ...).

    Raised on every rank of the group, before any state changed, so that the
    ranks stay in step and nothing waits forever.
    """


class ConfigError(KVHybridError, ValueError):
    """An environment setting has a value kvhybrid cannot use."""
