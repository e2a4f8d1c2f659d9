"""Where kvhybrid's C++ helpers lie: shared libraries ``setup.py`` builds (optional: without
a compiler or MXNet's headers they are not built), loaded with ctypes (or, one called on
the caller's thread every step, imported as a Python module), each with a switch. A module
that uses one declares it as a ``Helper`` with its functions' signatures."""
from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

log = logging.getLogger("kvhybrid")


def load_helper(module: str, switch: str, without: str,
                package: str = "kvhybrid.tensor_collectives", imported: bool = False):
    """The helper built as ``<package>.<module>`` (from ``<module>.cc`` less its leading
    underscore, in that package's folder), or None where the environment variable
    ``switch`` is ``0``, it was not built, or it does not load (``_ndarray_aux`` is linked
    to the ``libmxnet.so`` it was built against); ``without`` says what happens then
    (logged). A ctypes library, or with ``imported`` the Python module it is (``_ids``: a
    call through ctypes reads its arrays' addresses in Python)."""
    if os.environ.get(switch, "1") == "0":
        log.debug("%s=0: %s", switch, without)
        return None
    spec = importlib.util.find_spec(f"{package}.{module}")
    if spec is None or not spec.origin:
        log.debug("%s/%s.cc was not built: %s", package.replace(".", "/"), module.lstrip("_"),
                  without)
        return None
    try:   # (it fails to load where its libmxnet.so moved: a venv copied elsewhere)
        return importlib.import_module(spec.name) if imported else ctypes.CDLL(spec.origin)
    except (OSError, ImportError) as exc:
        log.warning("kvhybrid's C++ helper %s does not load (%s): %s; rebuild it against "
                    "this MXNet: pip install --no-build-isolation -e .", spec.origin, exc,
                    without)
        return None


#: a C function's ctypes signature: (its return type, or None for void; its arguments' types)
Signature = Tuple[Optional[type], Sequence[type]]


class Helper:
    """One C++ helper (``load_helper``'s arguments), looked for at first use and once per
    process, its functions' signatures declared then (undeclared, ctypes would pass every
    argument as a C int and read every result as one). A function the build lacks (built
    before it was added) is left out: its user checks ``hasattr`` first."""

    def __init__(self, module: str, switch: str, without: str,
                 signatures: Dict[str, Signature], package: str = "kvhybrid.tensor_collectives",
                 imported: bool = False):
        self.module, self.switch, self.without, self.package = module, switch, without, package
        self.signatures, self.imported = signatures, imported
        #: [the library (or module), or None], once looked for (a test sets [None] to run
        #: without it)
        self.loaded: List[Optional[object]] = []

    def library(self):
        """The loaded library (or module, ``imported``), or None where it is off, was not
        built or does not load."""
        if not self.loaded:
            lib = load_helper(self.module, self.switch, self.without, self.package,
                              self.imported)
            if lib is not None:
                for name, (result, arguments) in self.signatures.items():
                    function = getattr(lib, name, None)   # (None: a build older than it)
                    if function is not None:
                        function.restype, function.argtypes = result, list(arguments)
            self.loaded.append(lib)
        return self.loaded[0]
