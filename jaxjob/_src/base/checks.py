"""Argument checks: an int that is not a bool (``True`` is an ``int`` to ``isinstance``)."""

from __future__ import annotations

from types import UnionType
from typing import Any

__all__ = ["is_int", "is_number"]


def is_int(value: Any, kinds: type | UnionType | tuple[type, ...] = int) -> bool:
    """Whether ``value`` is an instance of ``kinds`` (``int`` by default) and not a bool.

    Example:
        >>> is_int(3), is_int(True), is_int(3.0)
        (True, False, False)
    """
    return isinstance(value, kinds) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a ``float``, and not a bool.

    Example:
        >>> is_number(2), is_number(0.5), is_number(False), is_number("1")
        (True, True, False, False)
    """
    return is_int(value, int | float)
