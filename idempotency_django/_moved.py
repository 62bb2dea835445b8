"""The import paths of 0.2.0 whose modules moved into ``protocol/`` and ``stores/``.

Each old path is a module that re-exports the new one and warns
(``DeprecationWarning``) when imported; they go in 1.0. Nothing in the
package imports them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def moved(old: str, new: ModuleType) -> Callable[[str], Any]:
    """Warn that ``old`` moved to ``new``; return the old module's ``__getattr__``."""
    warnings.warn(
        f"{old} moved to {new.__name__}: import it from there ({old} goes in 1.0).",
        DeprecationWarning,
        stacklevel=3,
    )

    def __getattr__(name: str) -> Any:
        return getattr(new, name)

    return __getattr__
