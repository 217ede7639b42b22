"""Key-path patterns: which subtrees of a checkpoint ``leaves=`` selects, with no JAX involved.

A key path is the ``/``-joined list of the dict keys and sequence indices
from a persistent name down to a subtree: ``"params/layers/3/w"``. A pattern
is a key path whose segments may hold ``*`` (any characters within one
segment, as in :mod:`fnmatch`) or be ``**`` (any number of segments, none
included). A pattern selects the outermost subtrees it matches: ``"params"``
and ``"params/**"`` both select the whole of ``params``.

Paths are read from the manifest's JSON tree structures
(:mod:`jaxjob._src.checkpoint.manifest`), so selecting reads no array data. This module
imports neither JAX nor Orbax (the ``jaxjob`` command uses it).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "Selection",
    "entry_segments",
    "join",
    "leaf_names",
    "match",
    "nodes",
    "select",
    "split",
    "whole",
]


def split(path: str) -> tuple[str, ...]:
    """The segments of a ``/``-joined key path (empty segments dropped).

    Example:
        >>> split("params/layers/3/w")
        ('params', 'layers', '3', 'w')
    """
    return tuple(s for s in path.split("/") if s)


def join(segments: Iterable[Any]) -> str:
    """The ``/``-joined key path of ``segments``."""
    return "/".join(str(s) for s in segments)


def entry_segments(path: Iterable[Any]) -> tuple[str, ...]:
    """The segments of a JAX key path (``DictKey``, ``GetAttrKey``, ``SequenceKey``, ...)."""
    out = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                out.append(str(getattr(entry, attr)))
                break
        else:
            out.append(str(entry))
    return tuple(out)


def _key_text(key: Any) -> str:
    """A dict key of the manifest structure as a segment: ``{"int": 3}`` -> ``"3"``."""
    if isinstance(key, dict):
        return str(key.get("int", key.get("bool")))
    return str(key)


def _children(structure: Mapping[str, Any]) -> list[tuple[str, Any]]:
    if "dict" in structure:
        return [(_key_text(k), v) for k, v in structure["dict"]]
    items = structure.get("tuple", structure.get("list", []))
    return [(str(i), v) for i, v in enumerate(items)]


def nodes(structure: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple]:
    """Every node of a manifest structure, parents first: ``(segments, substructure)``."""
    yield prefix, structure
    for key, child in _children(structure):
        yield from nodes(child, (*prefix, key))


def leaf_names(structure: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple]:
    """The leaves under a manifest structure, in order: ``(segments, stored name)``."""
    return [(segs, s["leaf"]) for segs, s in nodes(structure, prefix) if "leaf" in s]


def match(pattern: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    """Whether ``segments`` matches ``pattern`` (segments with ``*``; ``**`` for any number).

    Example:
        >>> match(split("model/**/w"), split("model/layers/10/w"))
        True
        >>> match(split("model/layers/1*/w"), split("model/layers/2/w"))
        False
    """
    if not pattern:
        return not segments
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(match(rest, segments[i:]) for i in range(len(segments) + 1))
    return bool(segments) and fnmatch.fnmatchcase(segments[0], head) and match(rest, segments[1:])


@dataclasses.dataclass(frozen=True)
class Selection:
    """One selected subtree.

    Attributes:
        key: Where it comes back: the name, or the ``/``-joined key path.
        name: The persistent name it lies under.
        segments: Its key path under ``name``.
        structure: Its manifest (JSON) tree structure.
    """

    key: str
    name: str
    segments: tuple[str, ...]
    structure: Any


def _outermost(found: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    kept: list[tuple[str, ...]] = []
    for segs in found:  # parents come first
        if not any(segs[: len(k)] == k for k in kept):
            kept.append(segs)
    return kept


def _every_node(state: Mapping[str, Any]) -> dict[tuple[str, ...], tuple[str, tuple, Any]]:
    """Every node by its full key path: ``(name, segments under it, substructure)``.

    A name holding ``/`` (``"jaxjob/epochs_done"``) is that many segments.
    """
    return {
        (*split(name), *segs): (name, segs, s)
        for name, st in state.items()
        for segs, s in nodes(st)
    }


_WILDCARDS = frozenset("*?[")  # fnmatch's: a segment without them matches itself only


def select_one(state: Mapping[str, Any], pattern: str) -> list[Selection]:
    """The outermost subtrees of ``state`` (name -> structure) that ``pattern`` matches."""
    return _select_one(_every_node(state), pattern)


def _select_one(every: Mapping[tuple[str, ...], tuple], pattern: str) -> list[Selection]:
    """:func:`select_one` over ``every`` node (:func:`_every_node`).

    A pattern without wildcards is looked up, not matched against every node:
    a restore of 250 names out of 1000 leaves matched 250 x 1000 key paths.
    """
    wanted = split(pattern)
    if not _WILDCARDS.intersection(pattern):
        return [Selection(join(wanted), *every[wanted])] if wanted in every else []
    chosen = _outermost([full for full in every if match(wanted, full)])
    return [Selection(join(full), *every[full]) for full in chosen]


def close_names(state: Mapping[str, Any], pattern: str, n: int = 5) -> list[str]:
    """Key paths of ``state`` that look like ``pattern`` (for error messages)."""
    paths = [join(full) for full in _every_node(state)]
    close = difflib.get_close_matches(pattern, paths, n=n, cutoff=0.5)
    return close or sorted(state)[:n]


def whole(state: Mapping[str, Any]) -> dict[str, Selection]:
    """Every name of ``state``, whole."""
    return {name: Selection(name, name, (), s) for name, s in state.items()}


def select(
    state: Mapping[str, Any], patterns: Iterable[str] | None, *, where: str = ""
) -> dict[str, Selection]:
    """The subtrees that ``patterns`` select (None: every name), by key, in pattern order.

    ``where`` (e.g. ``" in the checkpoint at '/runs/x'"``) goes into the error.

    Raises:
        KeyError: If a pattern matches nothing (listing close key paths).

    Example:
        >>> layer = {"dict": [["w", {"leaf": "l0"}]]}
        >>> state = {"model": {"list": [layer] * 12}}
        >>> list(select(state, ["model/1*/w"]))
        ['model/1/w', 'model/10/w', 'model/11/w']
    """
    if patterns is None:
        return whole(state)
    every = _every_node(state)  # once, not once per pattern
    chosen: dict[str, Selection] = {}
    for pattern in patterns:
        found = _select_one(every, pattern)
        if not found:
            raise KeyError(
                f"leaves [{pattern!r}] match nothing{where}; close key paths: "
                f"{close_names(state, pattern)}; available: {sorted(state)}"
            )
        chosen.update((s.key, s) for s in found)
    return chosen
