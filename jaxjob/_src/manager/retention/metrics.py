"""The scalars a save stores in its manifest: what ``keep.Best`` ranks the epochs by."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["metrics_of"]


def metrics_of(
    names: Sequence[str], outputs: Mapping[str, Any], state: Mapping[str, Any]
) -> dict[str, float]:
    """The finite numeric scalars among ``outputs``, and ``names`` (outputs first, else ``state``).

    Raises:
        ValueError: If one of ``names`` is present but not a numeric scalar.

    Example:
        >>> metrics_of(["acc"], {"loss": np.float32(0.5), "img": np.ones(3)}, {"acc": 1})
        {'loss': 0.5, 'acc': 1.0}
    """
    found: dict[str, float] = {}
    for name, value in outputs.items():
        if (scalar := _scalar(value)) is not None:
            found[name] = scalar
    for name in names:
        value = outputs[name] if name in outputs else state.get(name)
        if value is None:
            continue
        if (scalar := _scalar(value)) is None:
            raise ValueError(
                f"keep=Best({name!r}) ranks by a numeric scalar, but {name!r} is "
                f"{type(value).__name__} of shape {np.shape(value)}; return a scalar under "
                "that name"
            )
        found[name] = scalar
    # NaN and inf are not ranked (keep.Best) and not stored: a manifest holds finite numbers
    return {name: value for name, value in found.items() if math.isfinite(value)}


def _scalar(value: Any) -> float | None:
    if isinstance(value, jax.Array):
        value = value.addressable_data(0)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        return None
    numeric = np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    if array.size != 1 or not numeric:
        return None
    return float(array.reshape(()))
