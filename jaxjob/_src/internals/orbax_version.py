"""The Orbax releases jaxjob is tested with: its Orbax modules check the installed one on import.

Every ``internals.orbax_*`` module calls :func:`check` as it is imported, so
another release raises an ``ImportError`` saying which, instead of failing at
the first save. It uses no Orbax name (the installed version is read from the
package metadata).
"""

from __future__ import annotations

import functools
import importlib.metadata

__all__ = ["TESTED_ORBAX", "check", "has_atomicity_options"]

TESTED_ORBAX = ((0, 12, 1), (0, 13, 0))  # [lower, upper): keep in sync with pyproject.toml


@functools.cache
def _installed() -> tuple[str, tuple[int, ...]]:
    """The installed orbax-checkpoint's version: as written, and its numbers."""
    installed = importlib.metadata.version("orbax-checkpoint")
    return installed, tuple(int(p) for p in installed.split(".")[:3] if p.isdigit())


def has_atomicity_options() -> bool:
    """Whether Orbax has ``ocp.options.AtomicityOptions`` (0.12.3 and later)."""
    return _installed()[1] >= (0, 12, 3)


@functools.cache
def check() -> None:
    """Raises ImportError unless the installed orbax-checkpoint is in :data:`TESTED_ORBAX`."""
    installed, parts = _installed()
    low, high = TESTED_ORBAX
    if not low <= parts < high:
        raise ImportError(
            f"jaxjob needs orbax-checkpoint >={'.'.join(map(str, low))},<"
            f"{'.'.join(map(str, high))} (the versions it is tested with), but {installed} "
            "is installed; run: pip install 'orbax-checkpoint>=0.12.1,<0.13'"
        )
