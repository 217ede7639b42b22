"""Which leaves a checkpoint can hold: their kinds, the predicate and the sentence that says it.

The job model (a task's returned leaves) and the codec (what a save stores)
both use them, so they live below both.
"""

from __future__ import annotations

import enum
from typing import Any

import jax
import numpy as np

__all__ = ["HOST_LOCAL", "SUPPORTED", "Kind", "checkpointable"]


class Kind(enum.StrEnum):
    """A stored leaf's kind, as the manifest records it (the value is the manifest's string).

    Example:
        >>> Kind("prng_key") is Kind.PRNG_KEY, Kind.NUMPY == "numpy"
        (True, True)
    """

    JAX = "jax"
    PRNG_KEY = "prng_key"
    NUMPY = "numpy"
    NUMPY_SCALAR = "numpy_scalar"
    PYTHON = "python"


HOST_LOCAL = frozenset({Kind.NUMPY, Kind.NUMPY_SCALAR, Kind.PYTHON})  # one copy per process

SUPPORTED = (
    "leaves must be jax.Array, NumPy arrays (not of object dtype) or scalars, or Python "
    "bool/int/float"
)


def checkpointable(leaf: Any) -> bool:
    """Whether a checkpoint can hold ``leaf`` (tracers of jitted code count as ``jax.Array``).

    Example:
        >>> import numpy as np
        >>> checkpointable(np.zeros(2)), checkpointable(1.5), checkpointable("text")
        (True, True, False)
    """
    if isinstance(leaf, jax.Array):
        return True
    if isinstance(leaf, np.ndarray | np.generic):
        return not leaf.dtype.hasobject
    return isinstance(leaf, bool | int | float)
