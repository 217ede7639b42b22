"""A host-memory budget: the leaves of a restore read in groups of at most so many bytes.

Orbax reads every requested leaf at once: TensorStore holds each leaf's
stored bytes while it copies them into the restored array, so a restore's
peak host memory is the workspace plus up to one more copy of what is in
flight (``benchmarks/README.md``: 1.2-1.7x the workspace). Under
``CheckpointOptions(max_host_bytes=...)`` (or ``jaxjob.restore(...,
max_host_bytes=...)``) the leaves are read in groups of at most that many
bytes, one group after the other, so that what is in flight beside the
restored arrays stays within the budget. A leaf larger than the budget is
read alone (its group is that leaf): the restored workspace must hold it
anyway, and only its own read's staging can exceed the budget, which the
log says once per restore.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxjob._src.base.log import get_logger

__all__ = ["check_budget", "groups", "host_bytes"]

logger = get_logger(__name__)


def check_budget(value: Any, name: str = "max_host_bytes") -> int | None:
    """``value`` as a budget in bytes: None (no budget) or a positive int.

    Raises:
        ValueError: Naming ``name``, what was given and what is expected.

    Example:
        >>> check_budget(2**20), check_budget(None)
        (1048576, None)
        >>> check_budget(0)
        Traceback (most recent call last):
        ...
        ValueError: max_host_bytes must be None or a positive number of bytes (an int), got 0
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(
            f"{name} must be None or a positive number of bytes (an int), got {value!r}"
        )
    return int(value)


def host_bytes(target: Any) -> int:
    """The bytes one restored copy of ``target`` (anything with a shape and a dtype) holds.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> host_bytes(jax.ShapeDtypeStruct((4, 8), jnp.float32)), host_bytes(3)
        (128, 8)
    """
    shape = getattr(target, "shape", None)
    dtype = getattr(target, "dtype", None)
    if shape is None or dtype is None:
        return 8  # a Python scalar
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # an extended dtype (a typed PRNG key): its words, as stored
        itemsize = 8
    return math.prod(shape) * itemsize


def groups(sizes: Mapping[str, int], budget: int | None) -> list[list[str]]:
    """The names of ``sizes`` in groups of at most ``budget`` bytes each, in order.

    Without a budget all of them are one group. A name larger than the
    budget is a group of its own.

    Example:
        >>> groups({"a": 6, "b": 3, "c": 2, "d": 9, "e": 1}, 8)
        [['a', 'c'], ['b', 'e'], ['d']]
        >>> groups({"a": 6, "b": 3}, None)
        [['a', 'b']]
    """
    names = list(sizes)
    if budget is None or not names:
        return [names] if names else []
    out: list[list[str]] = []
    open_groups: list[tuple[int, list[str]]] = []  # (bytes so far, names) of groups with room
    for name in sorted(names, key=lambda n: -sizes[n]):  # largest first: fewer, fuller groups
        size = sizes[name]
        for i, (used, members) in enumerate(open_groups):
            if used + size <= budget:
                members.append(name)
                open_groups[i] = (used + size, members)
                break
        else:
            members = [name]
            out.append(members)
            open_groups.append((size, members))
    order = {n: i for i, n in enumerate(names)}
    for members in out:
        members.sort(key=order.__getitem__)
    out.sort(key=lambda m: order[m[0]])
    over = [n for n in names if sizes[n] > budget]
    if over:
        logger.info(
            "leaves %s are larger than max_host_bytes=%d: each is read alone", over[:5], budget
        )
    return out
