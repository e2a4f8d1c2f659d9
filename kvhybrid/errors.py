"""Exceptions kvhybrid raises. Every message names the cause and how to fix it.

Every one is an ``mx.base.MXNetError`` (a ``RuntimeError``): code written for MXNet's own
stores catches that around kvstore calls, and must catch kvhybrid's errors the same way.
"""
from collections import defaultdict

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


def _ranks(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def explain(what: str, details, uneven: str = "") -> str:
    """The KeyValueError every rank raises when the ranks' calls differ or one failed its
    checks: what failed where, or how the calls differ (``details``: each rank's (local
    error, call text); ``uneven``: the sentence saying the ranks are at different training
    steps, if they are: ``watchdog.steps_differ``)."""
    errors = defaultdict(list)
    for rank, (error, _) in enumerate(details):
        if error:
            errors[error].append(rank)
    if errors:
        parts = [f"{_ranks(ranks)}: {error}" for error, ranks in errors.items()]
        return f"{what} failed on {'; '.join(parts)}"
    calls = defaultdict(list)
    for rank, (_, sig) in enumerate(details):
        calls[sig].append(rank)
    parts = [f"{_ranks(ranks)} called {sig}" for sig, ranks in calls.items()]
    return (f"{what} differs between ranks: {'; '.join(parts)}. " + (f"{uneven}. " if uneven
                                                                     else "") +
            "Every rank must make the same calls, in the same order, with the same arguments "
            "(keys, shapes, dtypes, settings)")
