"""Stored names: each leaf's key path, escaped, as Orbax stores it (``params/layers/0/w``).

A checkpoint's ``state`` item is a flat mapping from stored name to array, so
plain Orbax (``ocp.StandardCheckpointer().restore(<checkpoint>/state)``) gives
back a dict keyed by the key paths that ``jaxjob show`` prints. The rule:

* The name is the persistent name's ``/``-separated parts, then each key on the
  way down to the leaf (dict keys, attribute names, sequence indices; ``int``
  and ``bool`` keys as ``str`` writes them), joined with ``/``.
* In each part, every byte outside ``A-Z a-z 0-9 _ - .`` is written ``%XX``
  (its UTF-8 bytes in upper-case hex, as in URLs): ``/`` becomes ``%2F``,
  ``%`` becomes ``%25``, a space ``%20``. A part of only dots (``.``, ``..``)
  has every dot escaped (``%2E``), an empty part is ``~``; a part is cut to
  :data:`MAX_PART` characters and a name to :data:`MAX_NAME` (at a ``/``).
* No two leaves share a name, nor differ only in letter case, nor is one
  name a ``/``-prefix of another (a name is a directory in checkpoints written
  without OCDBT), nor does one start with a file Orbax keeps beside the arrays
  (``_METADATA``, ...): a name that would is given ``~1`` (``~2``, ...) at the
  end of its last part, else of an earlier part (the first one that makes it
  free; leaves are named in JAX's order). ``~`` appears nowhere else, so a
  custom node's keys ``0`` and ``"0"``, the name ``"a/b"`` beside ``{"a": {"b":
  y}}``, or the keys ``"W"`` and ``"w"`` stay apart: the second is ``0~1``,
  ``a/b~1``, ``w~1``; a leaf ``lst/0`` beside ``lst/0/x`` makes the later
  ``lst/0~1/x``.

The manifest maps every key path to its stored name; nothing reads a name
back into a key path. :data:`MAX_NAME` does not budget for the object key
around a name: without OCDBT (a private checkpoint) on an object store (keys
of at most 1024 bytes), ``<db_prefix>/<node>.<epoch>/state/<name>/<chunk>``
must fit, which docs/format.md's "Leaves" section states.
This module imports neither JAX nor Orbax.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

__all__ = ["MAX_NAME", "MAX_PART", "Namer", "check", "check_disjoint", "escape"]

MAX_PART = 120  # characters of one escaped part (a file name is at most 255 bytes)
MAX_NAME = 1000  # characters of a whole name, before any ~N
# What Orbax writes beside the arrays of an item written without OCDBT (and zarr's own files).
RESERVED = frozenset(
    {"_checkpoint_metadata", "_metadata", "_root_metadata", "_sharding", "array_metadatas"}
    | {"commit_success.txt", "manifest.ocdbt", ".zarray", ".zattrs", ".zgroup", "zarr.json"}
)
_PLAIN = re.compile(r"[A-Za-z0-9_.-]+")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_PART = re.compile(r"(?:[A-Za-z0-9_.-]|%[0-9A-F]{2})+(?:~[1-9][0-9]{0,8})?|~(?:~[1-9][0-9]{0,8})?")


@functools.lru_cache(maxsize=4096)  # parts repeat: "params", "kernel", "0", ...
def escape(part: str) -> str:
    """One part of a stored name: bytes outside ``A-Za-z0-9_-.`` as ``%XX``.

    Example:
        >>> escape("kernel"), escape("a/b"), escape("x y%"), escape(".."), escape("")
        ('kernel', 'a%2Fb', 'x%20y%25', '%2E%2E', '~')
        >>> len(escape("." * 50)), len(escape("." * 41)) == len(escape("." * 40))
        (120, True)
    """
    if _PLAIN.fullmatch(part) and len(part) <= MAX_PART and part.strip("."):
        return part
    if not part:
        return "~"
    if set(part) == {"."}:
        text = "%2E" * len(part)
    else:
        raw = part.encode("utf-8", "replace")
        text = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
    if len(text) <= MAX_PART:
        return text
    cut = text[:MAX_PART]
    return cut[: cut.rfind("%")] if "%" in cut[-2:] else cut


def _shorten(parts: list[str]) -> list[str]:
    """The first parts whose joined name fits :data:`MAX_NAME` (at least one)."""
    if sum(map(len, parts)) + len(parts) - 1 <= MAX_NAME:
        return parts
    kept, size = [], -1
    for part in parts:
        if kept and size + 1 + len(part) > MAX_NAME:
            break
        kept.append(part)
        size += 1 + len(part)
    return kept


class Namer:
    """Gives each leaf of one checkpoint its stored name, in order (see the module docstring).

    Example:
        >>> namer = Namer()
        >>> [namer.name(["params", "w"]), namer.name(["params/w"]), namer.name(["Params", "W"])]
        ['params/w', 'params%2Fw', 'Params/W~1']
        >>> namer.name(["params"])
        'params~1'
    """

    def __init__(self) -> None:
        self._names: set[str] = set(RESERVED)  # lower-cased
        self._dirs: set[str] = set()  # lower-cased proper '/'-prefixes of the names

    def _free(self, parts: list[str]) -> tuple[str, ...] | None:
        """The lower-cased prefixes of ``parts`` (the name last), if the name is free."""
        prefixes = _prefixes(parts)
        if prefixes[-1] in self._names or prefixes[-1] in self._dirs:
            return None
        if any(p in self._names for p in prefixes[:-1]):
            return None
        return prefixes

    def _take(self, parts: list[str], prefixes: tuple[str, ...]) -> str:
        self._names.add(prefixes[-1])
        self._dirs.update(prefixes[:-1])
        return "/".join(parts)

    def name(self, segments: Iterable[object]) -> str:
        """The stored name of the leaf at ``segments`` (the key path's parts, unescaped)."""
        parts = _shorten([escape(str(s)) for s in segments] or ["~"])
        prefixes = self._free(parts)
        if prefixes is not None:
            return self._take(parts, prefixes)
        n = 1
        while True:
            for i in reversed(range(len(parts))):
                tried = [*parts[:i], f"{parts[i]}~{n}", *parts[i + 1 :]]
                prefixes = self._free(tried)
                if prefixes is not None:
                    return self._take(tried, prefixes)
            n += 1


def _prefixes(parts: list[str]) -> tuple[str, ...]:
    """The lower-cased ``/``-joined prefixes of ``parts``: ``a``, ``a/b``, ..., the whole name.

    Escaped parts are ASCII: lower-casing keeps every length.
    """
    low = "/".join(parts).lower()
    ends, at = [], -1
    for part in parts[:-1]:
        at += len(part) + 1
        ends.append(low[:at])
    return (*ends, low)


def check(name: object) -> None:
    """Refuses a stored name that no save writes (a manifest is read with it).

    A stored name becomes an Orbax key and, without OCDBT, directories: one
    that is not ``/``-joined escaped parts could reach outside its checkpoint.

    Raises:
        ValueError: Naming the name and what a stored name is.

    Example:
        >>> check("params/layers/0/w"), check("l0"), check("a%2Fb~1")
        (None, None, None)
        >>> check("../x")
        Traceback (most recent call last):
        ...
        ValueError: name is "../x", expected a stored name: /-joined parts of A-Za-z0-9_-. ...
    """
    ok = isinstance(name, str) and len(name) <= MAX_NAME + 64
    parts = name.split("/") if ok else []
    ok = ok and all(
        _PART.fullmatch(p) and len(p) <= MAX_PART + 10 and set(p) != {"."} for p in parts
    )
    if not ok:
        shown = str(name)[:60].replace('"', '\\"')
        raise ValueError(
            f'name is "{shown}", expected a stored name: /-joined parts of A-Za-z0-9_-. and '
            "%XX escapes, each optionally ending in ~N"
        )


def check_disjoint(names: Iterable[str]) -> None:
    """Refuses stored names of which one is a ``/``-prefix of another (or a reserved file).

    Raises:
        ValueError: Naming both names.

    Example:
        >>> check_disjoint(["a/b", "a/c", "ab"])
        >>> check_disjoint(["a", "a/b"])
        Traceback (most recent call last):
        ...
        ValueError: stored name 'a' is a directory of stored name 'a/b'
    """
    every = {n.casefold(): n for n in names}
    for low, name in every.items():
        parts = low.split("/")
        if parts[0] in RESERVED:
            raise ValueError(f"stored name {name!r} starts with a file Orbax writes beside it")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in every:
                raise ValueError(
                    f"stored name {every['/'.join(parts[:i])]!r} is a directory of stored "
                    f"name {name!r}"
                )
