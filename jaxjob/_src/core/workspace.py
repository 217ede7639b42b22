"""The workspace: an immutable mapping ``name -> pytree``, registered as a pytree."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax

__all__ = ["Workspace", "check_names"]


class Workspace(Mapping[str, Any]):
    """An immutable mapping from leaf names to pytrees; itself a pytree.

    Values may be any pytree whose leaves are ``jax.Array`` s (sharded or
    not), NumPy arrays or Python scalars. Names iterate in sorted order, as
    ``dict`` keys do in JAX's pytree flattening. Every "modifying" method
    returns a new workspace; the values are shared, not copied.

    Args:
        mapping: Initial names and values. Names must be non-empty strings.

    Raises:
        TypeError: If ``mapping`` is not a mapping or a name is not a string.

    Example:
        >>> import jaxjob
        >>> ws = jaxjob.Workspace({"step": 0})
        >>> ws2 = ws.set({"lr": 0.1})
        >>> sorted(ws2), sorted(ws)
        (['lr', 'step'], ['step'])
        >>> sorted(ws2.remove("step"))
        ['lr']
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    __slots__ = ("_data",)

    def __init__(self, mapping: Mapping[str, Any] | None = None) -> None:
        data = {} if mapping is None else _checked(mapping, "mapping")
        self._data = dict(sorted(data.items()))

    def __getitem__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError:
            raise KeyError(
                f"name {name!r} is not in the workspace; it holds {sorted(self._data)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Workspace({sorted(self._data)})"

    def set(self, updates: Mapping[str, Any]) -> Workspace:
        """Returns a copy with ``updates`` set (added or replaced)."""
        return Workspace({**self._data, **_checked(updates, "updates")})

    def remove(self, *names: str) -> Workspace:
        """Returns a copy without ``names``.

        Raises:
            KeyError: If a name is not in the workspace.
        """
        missing = [n for n in names if n not in self._data]
        if missing:
            raise KeyError(f"remove: names {missing} are not in the workspace {sorted(self._data)}")
        return Workspace({k: v for k, v in self._data.items() if k not in names})

    def select(self, names: Iterable[str]) -> Workspace:
        """Returns a copy holding only those of ``names`` that are present."""
        keep = set(names)
        return Workspace({k: v for k, v in self._data.items() if k in keep})


def check_names(names: Iterable[Any], argument: str) -> None:
    """Raises unless every one of ``names`` is a non-empty ``str`` (a workspace name).

    Raises:
        TypeError: Naming ``argument`` and the first name that is not.

    Example:
        >>> check_names(["params", 3], "leaves")
        Traceback (most recent call last):
        TypeError: leaves: names must be non-empty strings, got 3 (int); a workspace ...
    """
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"{argument}: names must be non-empty strings, got {name!r} "
                f"({type(name).__name__}); a workspace name (a top-level key) is a string "
                "(the pytree under it may have other keys)"
            )


def _checked(mapping: Any, argument: str) -> dict[str, Any]:
    if not isinstance(mapping, Mapping):
        raise TypeError(
            f"{argument} must be a mapping of names to pytrees, got {type(mapping).__name__}"
        )
    check_names(mapping, argument)
    return dict(mapping)


def _flatten_with_keys(ws: Workspace):
    names = tuple(ws._data)
    return [(jax.tree_util.DictKey(n), ws._data[n]) for n in names], names


def _unflatten(names: tuple[str, ...], values: Iterable[Any]) -> Workspace:
    ws = object.__new__(Workspace)
    ws._data = dict(zip(names, values, strict=True))
    return ws


jax.tree_util.register_pytree_with_keys(
    Workspace,
    _flatten_with_keys,
    _unflatten,
    flatten_func=lambda ws: (list(ws._data.values()), tuple(ws._data)),
)
