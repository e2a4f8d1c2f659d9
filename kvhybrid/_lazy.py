"""Package attributes imported on first use (PEP 562), so ``import kvhybrid`` stays light."""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List, Tuple


def lazy_exports(package: str, exports: Dict[str, str],
                 names: List[str]) -> Tuple[Callable[[str], object], Callable[[], List[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``exports`` maps each public name to the
    module (relative to ``package``) that defines it; ``names`` are the package's globals."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name], package), name)

    def __dir__() -> List[str]:
        return sorted(set(names) | set(exports))

    return __getattr__, __dir__
