"""The leaf codecs: how each workspace leaf is stored through Orbax and read back.

A checkpoint stores a workspace as a flat mapping from *stored names* (each
leaf's escaped key path, ``"params/layers/0/w"``: no two leaves ever share one,
whatever their key paths; :mod:`~jaxjob._src.checkpoint.stored_names`) to
arrays (its ``state`` and ``outputs`` items), plus, in the manifest, the tree
structure (:mod:`~jaxjob._src.checkpoint.tree`) and one
:class:`~jaxjob._src.checkpoint.leaf_spec.LeafSpec` per leaf.

Three codecs turn leaves into what Orbax stores and back; a writer or reader
chooses one for the whole checkpoint:

* :class:`SharedCodec` (every process writes its part, SPMD): ``jax.Array`` s
  are global; NumPy arrays and scalars are host-local rows (see
  :mod:`jaxjob._src.checkpoint.hostlocal`).
* :class:`PrivateCodec` (one process writes the whole checkpoint alone): every
  leaf is copied to the host as a NumPy array.
* :class:`LocalCodec` (one process writes its local-tier copy alone): its
  shards of every ``jax.Array``, host-local leaves as :class:`PrivateCodec`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base.leaves import Kind
from jaxjob._src.checkpoint import dtypes, hostlocal
from jaxjob._src.checkpoint.leaf_spec import LeafSpec, check_storable

__all__ = ["Codec", "LocalCodec", "PrivateCodec", "Rows", "SharedCodec"]


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
    return dtypes.dtype_of(spec.dtype) if spec.host_local else np.dtype(leaf.dtype)


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
        return np.asarray(leaf, dtype=dtypes.dtype_of(spec.dtype)), None

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
