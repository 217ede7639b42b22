"""The leaf spec: what each stored leaf is, and the leaves that no checkpoint can store.

One :class:`LeafSpec` per leaf goes into the manifest (``to_json``, read
back by ``from_json`` after :func:`~jaxjob._src.checkpoint.schema.check_leaf`).
A leaf that no checkpoint can hold raises :class:`UnstorableLeafError`
(public as ``jaxjob.UnstorableLeafError``) before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base.leaves import HOST_LOCAL, SUPPORTED, Kind
from jaxjob._src.checkpoint import dtypes, schema

__all__ = ["LeafSpec", "UnstorableLeafError", "check_storable", "leaf_key"]

_CANONICAL = json.JSONEncoder(sort_keys=True)  # json.dumps(x, sort_keys=True), made once


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
    if dtypes.orbax_stores(np.dtype(dtype)) and math.prod(spec.shape) != 0:
        return  # every save, every leaf: no message built
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
            return dataclasses.replace(spec, nbytes=dtypes.nbytes(spec.dtype, spec.shape))
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
            return jax.ShapeDtypeStruct(self.shape, dtypes.dtype_of(self.dtype))
        return jax.ShapeDtypeStruct(self.shape, np.dtype(self.dtype))

    def to_json(self) -> dict[str, Any]:
        """The manifest entry (a new one each call)."""
        return {**self._entry, "shape": list(self.shape)}

    @functools.cached_property
    def canonical_json(self) -> str:
        """The manifest entry's canonical text (sorted keys, as checksums read it), made once."""
        return _CANONICAL.encode(self._entry)

    @functools.cached_property
    def _entry(self) -> dict[str, Any]:
        """The manifest entry, made once: the saves of one structure share their specs."""
        # Shallow: dataclasses.asdict deep-copies each field, ~10 us more a leaf (training thread).
        entry = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        entry["shape"], entry["kind"] = list(self.shape), str(self.kind)
        return entry

    @classmethod
    def from_json(cls, entry: Any, *, checked: bool = False) -> LeafSpec:
        """Reads a manifest entry, refusing any that a save does not write.

        ``checked``: the caller has checked ``entry`` already (a whole
        manifest's :func:`~jaxjob._src.checkpoint.schema.check`), so it is not
        checked again.

        Raises:
            ValueError: Naming the leaf and what is wrong: a missing or unknown
                key, a value of the wrong type, a dtype outside the allow-list,
                a shape that is negative, too large or wrong for the kind, or
                ``nbytes`` disagreeing with dtype and shape.
        """
        if not checked:
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


def leaf_key(leaf: Any) -> tuple[Any, ...] | None:
    """What :meth:`LeafSpec.of` reads of ``leaf``; None for a leaf it refuses by its type.

    A ``jax.Array`` 's type, dtype (a PRNG key's names its implementation),
    shape and sharding (with its memory kind); a NumPy array's or scalar's
    type, dtype and shape; a Python scalar's type and, for an ``int``, whether
    int64 holds it. Leaves of equal keys have equal specs, or both are refused.
    """
    if isinstance(leaf, jax.Array):
        return type(leaf), leaf.dtype, leaf.shape, leaf.sharding
    if isinstance(leaf, np.ndarray | np.generic):
        return type(leaf), leaf.dtype, leaf.shape
    if isinstance(leaf, bool | int | float):
        return type(leaf), type(leaf) is not int or -(2**63) <= leaf < 2**63
    return None


def _local_index(sharding: Any) -> int | None:
    """The index in ``jax.local_devices()`` of a single-device sharding's device, else None."""
    if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return None
    (device,) = sharding.device_set
    local = jax.local_devices()
    return local.index(device) if device in local else None
