"""The leaf codec: how each workspace leaf is described, stored and read back.

A checkpoint stores a workspace as a flat mapping from *stored names*
(``"l0"``, ``"l1"``, ...: no two leaves ever share one, whatever their key
paths) to arrays, plus, in the manifest, the tree structure and one
:class:`LeafSpec` per leaf. The structure keeps what a restore without model
code needs to rebuild the tree exactly: dict keys with their types (``int``
and ``str``), lists vs tuples, ``None`` and leaf order. NamedTuples and other
custom pytree nodes are kept in their dict (attribute names) or list form;
``restore(target=...)`` gives them back their own types.

Two codecs turn leaves into what Orbax stores and back:

* :class:`SharedCodec` (every process writes its part, SPMD): ``jax.Array`` s
  are global; NumPy arrays and scalars are host-local rows (see
  :mod:`jaxjob.hostlocal`).
* :class:`PrivateCodec` (one process writes the whole checkpoint alone): every
  leaf is copied to the host as a NumPy array.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob import hostlocal

__all__ = [
    "Codec",
    "LeafSpec",
    "PrivateCodec",
    "Rows",
    "SharedCodec",
    "checkpointable",
    "flatten",
    "leaf_names",
    "unflatten",
]

KINDS = ("jax", "prng_key", "numpy", "numpy_scalar", "python")
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


STORED_NAME = re.compile(r"l[0-9]+")  # "l0", "l1", ...: Orbax keys, and directory names


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """What a stored leaf is: its kind, logical dtype and shape, and where it was in the tree.

    Attributes:
        name: The stored name (unique within a checkpoint).
        path: The key path under the workspace, e.g. ``"['params']['w']"``.
        kind: ``"jax"``, ``"prng_key"``, ``"numpy"``, ``"numpy_scalar"`` or ``"python"``.
        dtype: The dtype's name (``"float32"``, ``"key<fry>"``; for Python
            scalars ``"bool"``, ``"int"`` or ``"float"``).
        shape: The logical (global) shape.
        impl: The PRNG implementation of a ``prng_key`` leaf.
    """

    name: str
    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    impl: str | None = None

    @property
    def host_local(self) -> bool:
        """Whether each process keeps its own copy (NumPy arrays and scalars)."""
        return self.kind in hostlocal.KINDS

    @classmethod
    def of(cls, leaf: Any, name: str, path: str) -> LeafSpec:
        """Describes ``leaf``.

        Raises:
            TypeError: If ``leaf`` cannot be checkpointed (naming ``path``).
        """
        if isinstance(leaf, jax.Array):
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                impl = str(jax.random.key_impl(leaf))
                return cls(name, path, "prng_key", str(leaf.dtype), leaf.shape, impl)
            return cls(name, path, "jax", str(leaf.dtype), leaf.shape)
        if isinstance(leaf, np.ndarray | np.generic) and not leaf.dtype.hasobject:
            kind = "numpy" if isinstance(leaf, np.ndarray) else "numpy_scalar"
            return cls(name, path, kind, str(leaf.dtype), tuple(np.shape(leaf)))
        if isinstance(leaf, bool | int | float):
            return cls(name, path, "python", type(leaf).__name__, ())
        raise TypeError(
            f"cannot checkpoint the leaf at {path} of type {type(leaf).__name__}; {SUPPORTED}"
        )

    def abstract(self) -> jax.ShapeDtypeStruct:
        """The leaf's logical shape and dtype (PRNG keys as typed keys)."""
        if self.kind == "prng_key":
            key = jax.eval_shape(lambda: jax.random.key(0, impl=self.impl))
            return jax.ShapeDtypeStruct(self.shape, key.dtype)
        if self.host_local:
            return jax.ShapeDtypeStruct(self.shape, hostlocal.dtype_of(self.dtype))
        return jax.ShapeDtypeStruct(self.shape, np.dtype(self.dtype))

    def to_json(self) -> dict[str, Any]:
        """The manifest entry."""
        # Shallow: dataclasses.asdict deep-copies each field, ~10 us more a leaf (training thread).
        entry = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        entry["shape"] = list(self.shape)
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> LeafSpec:
        """Reads a manifest entry.

        Raises:
            ValueError: If the entry is not a valid leaf description.
        """
        try:
            spec = cls(
                name=str(entry["name"]),
                path=str(entry["path"]),
                kind=str(entry["kind"]),
                dtype=str(entry["dtype"]),
                shape=tuple(int(d) for d in entry["shape"]),
                impl=None if entry.get("impl") is None else str(entry["impl"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"invalid leaf entry {entry!r} in the manifest: {err}") from None
        if (
            spec.kind not in KINDS
            or any(d < 0 for d in spec.shape)
            or not STORED_NAME.fullmatch(spec.name)
        ):
            raise ValueError(f"invalid leaf entry {entry!r} in the manifest")
        return spec


# ---- tree structure -------------------------------------------------------------------------


def _key(key: Any) -> Any:
    """A JSON form of a dict key: a string, or ``{"int": n}`` / ``{"bool": b}``."""
    if isinstance(key, bool):
        return {"bool": key}
    if isinstance(key, int | np.integer):
        return {"int": int(key)}
    return str(key)


def _unkey(key: Any) -> Any:
    if isinstance(key, dict):
        return bool(key["bool"]) if "bool" in key else int(key["int"])
    return key


def _children(tree: Any) -> list[tuple[Any, Any]]:
    """One level of a pytree node, in JAX's order: ``(key entry, child)`` pairs."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    return [(path[0], child) for path, child in flat]


def _is_leaf(tree: Any) -> bool:
    treedef = jax.tree_util.tree_structure(tree)
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _entry_key(entry: Any) -> Any:
    for attr in ("key", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return None


def flatten(
    tree: Any, where: str, counter: Iterator[int]
) -> tuple[Any, list[tuple[str, Any, str]]]:
    """The JSON structure of ``tree`` and its leaves as ``(stored name, leaf, key path)``.

    Leaves are in JAX's flattening order; stored names come from ``counter``.
    """
    leaves: list[tuple[str, Any, str]] = []

    def walk(node: Any, path: str) -> Any:
        if node is None:
            return {"none": True}
        if _is_leaf(node):
            name = f"l{next(counter)}"
            leaves.append((name, node, path))
            return {"leaf": name}
        children = _children(node)
        keyless = bool(children) and all(_entry_key(e) is None for e, _ in children)
        if type(node) in (list, tuple) or (type(node) is not dict and keyless):
            kind = "tuple" if type(node) is tuple else "list"
            return {kind: [walk(c, f"{path}{jax.tree_util.keystr((e,))}") for e, c in children]}
        return {
            "dict": [
                [_key(_entry_key(e)), walk(c, f"{path}{jax.tree_util.keystr((e,))}")]
                for e, c in children
            ]
        }

    return walk(tree, where), leaves


def unflatten(structure: Any, leaves: Mapping[str, Any]) -> Any:
    """Rebuilds a tree from its JSON structure and its leaves by stored name."""
    if "leaf" in structure:
        return leaves[structure["leaf"]]
    if "none" in structure:
        return None
    if "dict" in structure:
        return {_unkey(k): unflatten(v, leaves) for k, v in structure["dict"]}
    if "tuple" in structure:
        return tuple(unflatten(v, leaves) for v in structure["tuple"])
    return [unflatten(v, leaves) for v in structure["list"]]


def leaf_names(structure: Any) -> list[str]:
    """Stored names of the leaves under a JSON structure, in order."""
    if "leaf" in structure:
        return [structure["leaf"]]
    if "dict" in structure:
        return [n for _, v in structure["dict"] for n in leaf_names(v)]
    children = structure.get("tuple", structure.get("list", []))
    return [n for v in children for n in leaf_names(v)]


# ---- codecs ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rows:
    """Which copy of host-local leaves a process reads.

    Attributes:
        count: How many processes saved the checkpoint (0 for a private one).
        row: The saved process whose copy this process gets; None: its own.
    """

    count: int
    row: int | None = None


class Codec(Protocol):
    """Turns leaves into what Orbax stores, gives restore targets, and turns them back.

    ``abstract`` is where a leaf goes: a ``jax.ShapeDtypeStruct`` with the
    leaf's logical shape and dtype and the sharding to restore it with.
    """

    private: bool

    def encode(self, leaf: Any, spec: LeafSpec) -> tuple[Any, str | None]:
        """The stored value and, if the processes must agree on it, its digest."""

    def target(self, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """The Orbax restore target of a stored leaf."""

    def decode(self, value: Any, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """The leaf, with its saved type, from what Orbax restored."""


class SharedCodec:
    """Every process writes its part: global ``jax.Array`` s and per-process host-local rows."""

    private = False

    def encode(self, leaf: Any, spec: LeafSpec) -> tuple[Any, str | None]:
        """See :class:`Codec`."""
        if spec.host_local:
            return hostlocal.encode(leaf, spec), None
        if jax.process_count() > 1 and leaf.is_fully_addressable:
            return hostlocal.replicate(leaf)
        return leaf, None

    def target(self, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`."""
        if spec.host_local:
            return hostlocal.target(spec, rows.count, rows.row)
        return abstract

    def decode(self, value: Any, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`."""
        if spec.host_local:
            return hostlocal.decode(value, spec, rows.row)
        if spec.kind == "prng_key" and not jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(value, impl=spec.impl)
        return value


class PrivateCodec:
    """One process writes the checkpoint alone: every leaf is stored as a NumPy array."""

    private = True

    def encode(self, leaf: Any, spec: LeafSpec) -> tuple[Any, str | None]:
        """See :class:`Codec`.

        Raises:
            ValueError: For a ``jax.Array`` sharded over several processes' devices.
        """
        if spec.kind == "prng_key":
            return np.asarray(jax.random.key_data(leaf)), None
        if spec.kind == "jax":
            if not leaf.is_fully_addressable:
                raise ValueError(
                    f"a private (one process's) checkpoint cannot hold the jax.Array at "
                    f"{spec.path}, sharded over several processes' devices; checkpoint it with "
                    "a node that every process saves"
                )
            return np.asarray(leaf), None
        return np.asarray(leaf, dtype=hostlocal.dtype_of(spec.dtype)), None

    def target(self, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`."""
        stored = spec.abstract()
        if spec.kind == "prng_key":
            stored = jax.eval_shape(jax.random.key_data, stored)
        return np.zeros(stored.shape, stored.dtype)

    def decode(self, value: Any, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`."""
        if spec.host_local:
            return hostlocal.as_saved(np.asarray(value), spec)
        array = jax.device_put(value, abstract.sharding)
        if spec.kind == "prng_key":
            return jax.random.wrap_key_data(array, impl=spec.impl)
        return array
