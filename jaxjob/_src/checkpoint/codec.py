"""The leaf codec: how each workspace leaf is described, stored and read back.

A checkpoint stores a workspace as a flat mapping from *stored names* (each
leaf's escaped key path, ``"params/layers/0/w"``: no two leaves ever share one,
whatever their key paths; :mod:`~jaxjob._src.checkpoint.stored_names`) to
arrays, plus, in the manifest, the tree structure and one :class:`LeafSpec`
per leaf. The structure keeps what a restore without model
code needs to rebuild the tree exactly: dict keys with their types (``int``
and ``str``), lists vs tuples, ``None`` and leaf order. NamedTuples and other
custom pytree nodes are kept in their dict (attribute names) or list form;
``restore(target=...)`` gives them back their own types.

Two codecs turn leaves into what Orbax stores and back:

* :class:`SharedCodec` (every process writes its part, SPMD): ``jax.Array`` s
  are global; NumPy arrays and scalars are host-local rows (see
  :mod:`jaxjob._src.checkpoint.hostlocal`).
* :class:`PrivateCodec` (one process writes the whole checkpoint alone): every
  leaf is copied to the host as a NumPy array.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base.leaves import HOST_LOCAL, SUPPORTED, Kind
from jaxjob._src.checkpoint import dtypes, hostlocal, schema, stored_names

__all__ = [
    "Codec",
    "LeafSpec",
    "PrivateCodec",
    "Rows",
    "SharedCodec",
    "UnstorableLeafError",
    "flatten",
    "unflatten",
]


class UnstorableLeafError(TypeError):
    """A leaf that no save can store: the save refuses it before writing anything.

    Raised by every save of such a workspace, whatever ``on_save_error`` says
    (retrying cannot help). The message names the key path, the dtype and the
    shape.
    """

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X


def _check_int64(leaf: Any, path: str) -> None:
    """Refuses a Python int that int64 (its stored dtype) cannot hold.

    Raises:
        UnstorableLeafError: Naming the key path, the value and int64's range.
    """
    if type(leaf) is int and not -(2**63) <= leaf < 2**63:
        shown = repr(leaf) if leaf.bit_length() <= 256 else f"an int of {leaf.bit_length()} bits"
        raise UnstorableLeafError(
            f"cannot checkpoint the Python int at {path} ({shown}): it is outside int64's "
            "range [-2**63, 2**63 - 1], which a checkpoint stores Python ints as; store it "
            "as a str, or split it into int64 words (a NumPy array)"
        )


def check_storable(spec: LeafSpec, dtype: Any) -> None:
    """Refuses a leaf that Orbax would store as an array of ``dtype`` but cannot.

    Orbax 0.12 writes arrays through TensorStore, which has no ``uint2``,
    ``uint4`` or ``float8_e4m3`` (it has ``int2``, ``int4`` and the other
    float8 types), and refuses zero-size arrays outright.

    Raises:
        UnstorableLeafError: Naming the leaf's key path, dtype and shape.
    """
    kind = {Kind.JAX: "jax.Array", Kind.PRNG_KEY: "PRNG key array"}.get(spec.kind, "array")
    what = f"the {kind} at {spec.path} (dtype {spec.dtype}, shape {spec.shape})"
    if not dtypes.orbax_stores(np.dtype(dtype)):
        raise UnstorableLeafError(
            f"cannot checkpoint {what}: Orbax (TensorStore) cannot store dtype "
            f"{np.dtype(dtype).name}; save it as uint8 instead (x.astype(jnp.uint8) keeps "
            "uint2/uint4 values exactly, jax.lax.bitcast_convert_type(x, jnp.uint8) keeps "
            "float8_e4m3 bits) or keep it out of the persistent workspace"
        )
    if math.prod(spec.shape) == 0:
        raise UnstorableLeafError(
            f"cannot checkpoint {what}: Orbax cannot store a zero-size array; give it at "
            "least one element or keep it out of the persistent workspace"
        )


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """What a stored leaf is: its kind, logical dtype and shape, and where it was in the tree.

    Attributes:
        name: The stored name (unique within a checkpoint).
        path: The key path under the workspace, e.g. ``"['params']['w']"``.
        kind: Its :class:`~jaxjob._src.base.leaves.Kind` (``"jax"``, ``"prng_key"``,
            ``"numpy"``, ``"numpy_scalar"`` or ``"python"`` in the manifest).
        dtype: The dtype's name (``"float32"``, ``"key<fry>"``; for Python
            scalars ``"bool"``, ``"int"`` or ``"float"``), one of
            :mod:`~jaxjob._src.checkpoint.dtypes`.
        shape: The logical (global) shape.
        impl: The PRNG implementation of a ``prng_key`` leaf.
        nbytes: The bytes of one copy of a host-local leaf (its stored row
            holds them); None for other leaves.
        device: For a ``jax.Array`` on one device: that device's index in
            ``jax.local_devices()`` of the process that wrote the manifest
            (in SPMD code every process puts such an array on its device of
            that index); None for other leaves.
    """

    name: str
    path: str
    kind: Kind
    dtype: str
    shape: tuple[int, ...]
    impl: str | None = None
    nbytes: int | None = None
    device: int | None = None

    @property
    def host_local(self) -> bool:
        """Whether each process keeps its own copy (NumPy arrays and scalars)."""
        return self.kind in HOST_LOCAL

    @classmethod
    def of(cls, leaf: Any, name: str, path: str) -> LeafSpec:
        """Describes ``leaf``.

        Raises:
            UnstorableLeafError: If ``leaf`` cannot be checkpointed (naming ``path``).
        """
        spec = cls._describe(leaf, name, path)
        try:
            dtypes.check(spec.kind, spec.dtype, spec.impl)
        except ValueError as err:
            raise UnstorableLeafError(
                f"cannot checkpoint the leaf at {path} (shape {spec.shape}): {err}"
            ) from None
        if spec.host_local:
            return dataclasses.replace(spec, nbytes=hostlocal.nbytes(spec.dtype, spec.shape))
        return spec

    @classmethod
    def _describe(cls, leaf: Any, name: str, path: str) -> LeafSpec:
        if isinstance(leaf, jax.Array):
            device = _local_index(leaf.sharding)
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                impl = str(jax.random.key_impl(leaf))
                return cls(
                    name, path, Kind.PRNG_KEY, str(leaf.dtype), leaf.shape, impl, device=device
                )
            return cls(name, path, Kind.JAX, str(leaf.dtype), leaf.shape, device=device)
        if isinstance(leaf, np.ndarray | np.generic) and not leaf.dtype.hasobject:
            kind = Kind.NUMPY if isinstance(leaf, np.ndarray) else Kind.NUMPY_SCALAR
            return cls(name, path, kind, str(leaf.dtype), tuple(np.shape(leaf)))
        if isinstance(leaf, bool | int | float):
            _check_int64(leaf, path)
            return cls(name, path, Kind.PYTHON, type(leaf).__name__, ())
        raise UnstorableLeafError(
            f"cannot checkpoint the leaf at {path} of type {type(leaf).__name__}; {SUPPORTED}"
        )

    def abstract(self) -> jax.ShapeDtypeStruct:
        """The leaf's logical shape and dtype (PRNG keys as typed keys)."""
        if self.kind == Kind.PRNG_KEY:
            key = jax.eval_shape(lambda: jax.random.key(0, impl=self.impl))
            return jax.ShapeDtypeStruct(self.shape, key.dtype)
        if self.host_local:
            return jax.ShapeDtypeStruct(self.shape, hostlocal.dtype_of(self.dtype))
        return jax.ShapeDtypeStruct(self.shape, np.dtype(self.dtype))

    def to_json(self) -> dict[str, Any]:
        """The manifest entry."""
        # Shallow: dataclasses.asdict deep-copies each field, ~10 us more a leaf (training thread).
        entry = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        entry["shape"], entry["kind"] = list(self.shape), str(self.kind)
        return entry

    @classmethod
    def from_json(cls, entry: Any) -> LeafSpec:
        """Reads a manifest entry, refusing any that a save does not write.

        Raises:
            ValueError: Naming the leaf and what is wrong: a missing or unknown
                key, a value of the wrong type, a dtype outside the allow-list,
                a shape that is negative, too large or wrong for the kind, or
                ``nbytes`` disagreeing with dtype and shape.
        """
        schema.check_leaf(entry)
        return cls(
            entry["name"],
            entry["path"],
            Kind(entry["kind"]),
            entry["dtype"],
            tuple(entry["shape"]),
            entry["impl"],
            entry["nbytes"],
            entry["device"],
        )


def _local_index(sharding: Any) -> int | None:
    """The index in ``jax.local_devices()`` of a single-device sharding's device, else None."""
    if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return None
    (device,) = sharding.device_set
    local = jax.local_devices()
    return local.index(device) if device in local else None


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


def _pytree_children(tree: Any) -> list[tuple[Any, Any]]:
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


def is_nnx_variable(node: Any) -> bool:
    """Whether ``node`` is an ``nnx.Variable`` (``nnx.Param``...; flax is not imported)."""
    return any(
        k.__name__ == "Variable" and k.__module__.startswith("flax.nnx") for k in type(node).__mro__
    )


def flatten(
    tree: Any, where: str, namer: stored_names.Namer, segments: tuple[str, ...] = ()
) -> tuple[Any, list[tuple[str, Any, str]]]:
    """The JSON structure of ``tree`` and its leaves as ``(stored name, leaf, key path)``.

    Leaves are in JAX's flattening order; ``namer`` names each by its key path:
    ``segments`` (the persistent name's parts), then the keys down to it. An
    ``nnx.Variable`` 's node also records its type's name (``"variable":
    "Param"``), by which a filtered ``nnx.State`` target is told from one
    that lacks Variables (:mod:`jaxjob._src.checkpoint.targets`).
    """
    leaves: list[tuple[str, Any, str]] = []

    def walk(node: Any, path: str, parts: tuple[Any, ...]) -> Any:
        if node is None:
            return {"none": True}
        if _is_leaf(node):
            name = namer.name(parts)
            leaves.append((name, node, path))
            return {"leaf": name}
        children = _pytree_children(node)
        keyless = bool(children) and all(_entry_key(e) is None for e, _ in children)
        if type(node) in (list, tuple) or (type(node) is not dict and keyless):
            kind = "tuple" if type(node) is tuple else "list"
            return {
                kind: [
                    walk(c, f"{path}{jax.tree_util.keystr((e,))}", (*parts, i))
                    for i, (e, c) in enumerate(children)
                ]
            }
        keys = [_key(_entry_key(e)) for e, _ in children]
        _check_unique(keys, path)
        found: dict[str, Any] = {
            "dict": [
                [key, walk(c, f"{path}{jax.tree_util.keystr((e,))}", (*parts, _entry_key(e)))]
                for key, (e, c) in zip(keys, children, strict=True)
            ]
        }
        if is_nnx_variable(node):
            found["variable"] = type(node).__name__
        return found

    return walk(tree, where, segments), leaves


def _check_unique(keys: list[Any], path: str) -> None:
    """Refuses dict keys that are one key once stored (``1.5`` and ``"1.5"``: both ``"1.5"``).

    Raises:
        UnstorableLeafError: Naming the container's key path and the keys.
    """
    stored = [_unkey(k) for k in keys]
    if len(set(stored)) < len(stored):
        twice = sorted({str(k) for k in stored if stored.count(k) > 1})
        raise UnstorableLeafError(
            f"cannot checkpoint the container at {path or 'the top'}: its keys {twice} are "
            "the same once stored (a checkpoint keeps str, int and bool keys; others become "
            "their str); rename them"
        )


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


def _stored_dtype(leaf: Any, spec: LeafSpec) -> np.dtype:
    """The dtype of the array Orbax is given for ``leaf`` (a PRNG key's data, uint32)."""
    if spec.kind == Kind.PRNG_KEY:  # every JAX PRNG implementation's key data
        return np.dtype(np.uint32)
    return hostlocal.dtype_of(spec.dtype) if spec.host_local else np.dtype(leaf.dtype)


class SharedCodec:
    """Every process writes its part: global ``jax.Array`` s and per-process host-local rows."""

    private = False

    def encode(self, leaf: Any, spec: LeafSpec) -> tuple[Any, str | None]:
        """See :class:`Codec`."""
        if spec.host_local:  # stored as bytes: any dtype and shape
            return hostlocal.encode(leaf, spec), None
        check_storable(spec, _stored_dtype(leaf, spec))
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
        if spec.kind == Kind.PRNG_KEY and not jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(value, impl=spec.impl)
        return value


class PrivateCodec:
    """One process writes the checkpoint alone: every leaf is stored as a NumPy array."""

    private = True

    def encode(self, leaf: Any, spec: LeafSpec) -> tuple[Any, str | None]:
        """See :class:`Codec`.

        Raises:
            ValueError: For a ``jax.Array`` sharded over several processes' devices.
            UnstorableLeafError: For a leaf Orbax cannot store (see :func:`check_storable`).
        """
        check_storable(spec, _stored_dtype(leaf, spec))
        if spec.kind == Kind.PRNG_KEY:
            return np.asarray(jax.random.key_data(leaf)), None
        if spec.kind == Kind.JAX:
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
        if spec.kind == Kind.PRNG_KEY:
            stored = jax.eval_shape(jax.random.key_data, stored)
        return np.zeros(stored.shape, stored.dtype)

    def decode(self, value: Any, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`."""
        if spec.host_local:
            return hostlocal.as_saved(np.asarray(value), spec)
        array = jax.device_put(value, abstract.sharding)
        if spec.kind == Kind.PRNG_KEY:
            return jax.random.wrap_key_data(array, impl=spec.impl)
        return array


class LocalCodec(PrivateCodec):
    """One process writes its local-tier copy alone: its shards of every ``jax.Array``.

    A global ``jax.Array`` is given to Orbax as it is; this process's handler
    writes the shards it holds (one copy of each index), so the copy can be
    restored only onto the same shardings, by the same process. Host-local
    leaves are stored as in a private checkpoint.
    """

    def encode(self, leaf: Any, spec: LeafSpec) -> tuple[Any, str | None]:
        """See :class:`Codec`."""
        if spec.kind not in (Kind.JAX, Kind.PRNG_KEY) or leaf.is_fully_addressable:
            return super().encode(leaf, spec)  # this process's own: a NumPy host copy
        check_storable(spec, _stored_dtype(leaf, spec))
        _check_one_replica_holds_all(leaf, spec)
        if spec.kind == Kind.PRNG_KEY:
            return jax.random.key_data(leaf), None
        return leaf, None

    def target(self, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`: a global array's target has the sharding it is restored onto."""
        if spec.host_local or _this_process_only(abstract):
            return super().target(spec, abstract, rows)
        if spec.kind == Kind.PRNG_KEY:  # key data: one dimension more, not sharded
            data = jax.eval_shape(jax.random.key_data, spec.abstract())
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=abstract.sharding)
        return abstract

    def decode(self, value: Any, spec: LeafSpec, abstract: jax.ShapeDtypeStruct, rows: Rows) -> Any:
        """See :class:`Codec`."""
        if spec.host_local or _this_process_only(abstract):
            return super().decode(value, spec, abstract, rows)
        if spec.kind == Kind.PRNG_KEY:
            return jax.random.wrap_key_data(value, impl=spec.impl)
        return value


def _check_one_replica_holds_all(leaf: jax.Array, spec: LeafSpec) -> None:
    """Refuses a leaf whose shards here are not all on the replica of its first shard.

    This process writes the shards of that replica only (as Orbax's local
    checkpoints do): with an interleaved mesh another replica may hold an
    index that this one lacks, which the copy would then miss.

    Raises:
        ValueError: Naming the key path.
    """
    shards = leaf.addressable_shards
    first = shards[0].replica_id
    indices = {str(s.index) for s in shards}
    if {str(s.index) for s in shards if s.replica_id == first} != indices:
        raise ValueError(
            f"the local tier cannot store {spec.path}: this process holds its shards on "
            "several replicas (an interleaved mesh), so no one replica has them all; use a "
            "mesh whose replicas of each process's shards are its own devices"
        )


def _this_process_only(abstract: jax.ShapeDtypeStruct) -> bool:
    """Whether ``abstract`` 's sharding lies on this process's devices alone (or is unset)."""
    sharding = getattr(abstract, "sharding", None)
    return sharding is None or sharding.is_fully_addressable
