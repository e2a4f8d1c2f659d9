"""Where kvhybrid's C++ helpers lie: shared libraries ``setup.py`` builds (optional: without
a compiler or MXNet's headers they are not built), loaded with ctypes, each with a switch."""
from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from typing import Optional

log = logging.getLogger("kvhybrid")


def load_helper(module: str, switch: str, without: str,
                package: str = "kvhybrid.tensor_collectives") -> Optional[ctypes.CDLL]:
    """The helper built as ``<package>.<module>`` (from ``<module>.cc`` less its leading
    underscore, in that package's folder), or None where the environment variable
    ``switch`` is ``0``, it was not built, or it does not load (``_ndarray_aux`` is linked
    to the ``libmxnet.so`` it was built against); ``without`` says what happens then
    (logged)."""
    if os.environ.get(switch, "1") == "0":
        log.debug("%s=0: %s", switch, without)
        return None
    spec = importlib.util.find_spec(f"{package}.{module}")
    if spec is None or not spec.origin:
        log.debug("%s/%s.cc was not built: %s", package.replace(".", "/"), module.lstrip("_"),
                  without)
        return None
    try:
        return ctypes.CDLL(spec.origin)
    except OSError as exc:   # (a build whose libmxnet.so moved: a venv copied elsewhere)
        log.warning("kvhybrid's C++ helper %s does not load (%s): %s; rebuild it against "
                    "this MXNet: pip install --no-build-isolation -e .", spec.origin, exc,
                    without)
        return None
