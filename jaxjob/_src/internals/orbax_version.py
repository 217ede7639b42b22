"""The Orbax releases jaxjob is tested with: its Orbax modules check the installed one on import.

Every ``internals.orbax_*`` module calls :func:`check` as it is imported, so
another release raises an ``ImportError`` saying which, instead of failing at
the first save. It uses no Orbax name (the installed version is read from the
package metadata).
"""

from __future__ import annotations

import functools
import importlib.metadata

__all__ = ["TESTED_ORBAX", "check"]

TESTED_ORBAX = ((0, 12, 3), (0, 13, 0))  # [lower, upper): keep in sync with pyproject.toml


@functools.cache
def check() -> None:
    """Raises ImportError unless the installed orbax-checkpoint is in :data:`TESTED_ORBAX`."""
    installed = importlib.metadata.version("orbax-checkpoint")
    parts = tuple(int(p) for p in installed.split(".")[:3] if p.isdigit())
    low, high = TESTED_ORBAX
    if not low <= parts < high:
        raise ImportError(
            f"jaxjob needs orbax-checkpoint >={'.'.join(map(str, low))},<"
            f"{'.'.join(map(str, high))} (the versions it is tested with), but {installed} "
            "is installed; run: pip install 'orbax-checkpoint>=0.12.3,<0.13'"
        )
