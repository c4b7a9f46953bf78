"""Public names of a package, each imported on first access (PEP 562).

The subpackages of ``megatron.varlen`` are the library's public API, but importing one must stay
cheap: ``megatron.varlen.packing`` holds the torch-free length distributions beside modules that
import megatron-core's parallel state, and the argument parser imports the first without paying
for (or hearing the import-time warnings of) the second. A package's ``__init__`` therefore names
where each export lives and imports it when it is first used.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``exports`` maps each public name to the
    module defining it; a name that IS a module (its last dotted part) exports the module."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(exports[name])
        return module if module.__name__.rsplit(".", 1)[-1] == name else getattr(module, name)

    return __getattr__
