"""Host-local leaves (NumPy arrays, NumPy and Python scalars): one copy per process.

A host-local leaf is saved as a ``uint8`` ``jax.Array`` of shape
``(process_count, nbytes)`` whose row ``p`` holds process ``p``'s copy, sharded
over one device of each process, so that Orbax writes each row on its own host.
Bytes are stored exactly, whatever ``jax_enable_x64`` says; the leaf's shape
and dtype are in the checkpoint manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import errors
from jaxjob._src.base.checks import is_int
from jaxjob._src.base.leaves import Kind
from jaxjob._src.checkpoint.dtypes import dtype_of, nbytes
from jaxjob._src.checkpoint.leaf_spec import LeafSpec

__all__ = [
    "HostMap",
    "ProcessCountError",
    "as_saved",
    "decode",
    "encode",
    "is_host_copy",
    "replicate",
    "row_for_this_process",
    "target",
]

HostMap = Callable[[int], int] | Sequence[int]
_AXIS = "jaxjob_hosts"


def is_host_copy(sharding: Any) -> bool:
    """Whether ``sharding`` is :func:`host_sharding` 's: a stored copy of process-local data."""
    return isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.axis_names == (_AXIS,)


def host_sharding(spec: Any = _AXIS) -> jax.sharding.NamedSharding:
    """Row ``p`` of a ``(process_count, n)`` array on the first device of process ``p``.

    With ``spec=None``: replicated on the first device of every process.
    """
    first: dict[int, jax.Device] = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        first.setdefault(device.process_index, device)
    devices = np.array([first[p] for p in sorted(first)])
    mesh = jax.sharding.Mesh(devices, (_AXIS,))
    pspec = jax.sharding.PartitionSpec(spec) if spec else jax.sharding.PartitionSpec()
    return jax.sharding.NamedSharding(mesh, pspec)


def replicate(leaf: jax.Array) -> tuple[jax.Array, str]:
    """A global copy of a ``jax.Array`` that lives on this process only, and a digest of it.

    In SPMD code such an array (a jitted step's unsharded output: a counter,
    a PRNG key) holds the same value on every process; it is saved once, as
    a replicated global array. The digest lets the processes check that.
    """
    is_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    data = np.asarray(jax.random.key_data(leaf) if is_key else leaf)
    digest = hashlib.sha256(data.tobytes()).hexdigest()[:16] + str(data.dtype) + str(data.shape)
    value = jax.make_array_from_process_local_data(host_sharding(None), data, data.shape)
    if is_key:
        value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
    return value, digest


def _row_width(spec: LeafSpec) -> int:
    return max(1, nbytes(spec.dtype, spec.shape))


def encode(leaf: Any, spec: LeafSpec) -> jax.Array:
    """This process's copy of ``leaf`` as its row of the global ``uint8`` array."""
    data = np.asarray(leaf, dtype=dtype_of(spec.dtype))
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    row = np.zeros((1, _row_width(spec)), np.uint8)
    row[0, : data.size] = data
    return jax.make_array_from_process_local_data(
        host_sharding(), row, (jax.process_count(), row.shape[1])
    )


class ProcessCountError(ValueError):
    """Host-local leaves saved by another process count, and no ``host_map`` to restore them.

    Attributes:
        leaves: The key paths of the host-local leaves.
        saved_count: The process count that saved them.
        count: This job's process count.
    """

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X

    def __init__(self, leaves: Sequence[str], saved_count: int, count: int) -> None:
        super().__init__(
            f"host-local leaves {list(leaves)} were saved by {saved_count} processes but this "
            f"job has {count}; pass host_map (a callable or sequence giving, for each process of "
            "this job, the saved process whose copy it gets), e.g. host_map=lambda p: 0"
        )
        self.leaves, self.saved_count, self.count = list(leaves), saved_count, count

    def __reduce__(self) -> tuple[Any, ...]:
        return errors.pickled(self)


def row_for_this_process(
    host_map: HostMap | None, saved_count: int, leaves: Sequence[str]
) -> int | None:
    """Which saved process's copy this process restores; None means its own (same count).

    Args:
        host_map: The user's map, or None.
        saved_count: The process count that saved the checkpoint.
        leaves: The key paths of the host-local leaves restored (for the error).

    Raises:
        ProcessCountError: If the process count changed and ``host_map`` is None.
        ValueError: If ``host_map`` gives a row outside the saved processes.
    """
    me = jax.process_index()
    if host_map is None:
        if saved_count != jax.process_count():
            raise ProcessCountError(leaves, saved_count, jax.process_count())
        return None
    row = host_map(me) if callable(host_map) else host_map[me]
    if not is_int(row, int | np.integer) or not 0 <= row < saved_count:
        raise ValueError(
            f"host_map gave {row!r} for process {me}; expected an int in [0, {saved_count}) "
            f"(the checkpoint was saved by {saved_count} processes)"
        )
    return int(row)


def target(spec: LeafSpec, saved_count: int, row: int | None) -> jax.ShapeDtypeStruct:
    """The restore target: only this process's row, or the whole array when remapping."""
    if row is None:
        sharding = host_sharding()
    else:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct((saved_count, _row_width(spec)), np.uint8, sharding=sharding)


def decode(array: jax.Array, spec: LeafSpec, row: int | None) -> Any:
    """The leaf, with its saved type, from the restored ``uint8`` array."""
    if row is None:
        data = np.asarray(array.addressable_shards[0].data)[0]
    else:
        data = np.asarray(array)[row]
    size = nbytes(spec.dtype, spec.shape)
    value = data[:size].view(dtype_of(spec.dtype)).reshape(spec.shape).copy()
    return as_saved(value, spec)


def as_saved(value: np.ndarray, spec: LeafSpec) -> Any:
    """A host-local leaf's array (of :func:`dtype_of` its dtype) back as the saved type."""
    if spec.kind == Kind.NUMPY_SCALAR:
        return value[()]
    if spec.kind == Kind.PYTHON:
        return value.item()
    return value
