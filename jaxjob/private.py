"""Private checkpoint directories: written by one process alone, read by any, no waiting.

This is the caffe2 style across processes, where each process runs its own
:class:`~jaxjob.task.Node` and saves its own ``<node>.<epoch>`` checkpoints.
Orbax assumes that every process takes part in a save: its NumPy handler
writes only on process 0 and it refuses process-local ``jax.Array`` s in a
multi-process job. So a private directory stores every leaf as a NumPy array
(``jax.Array`` s copied to the host, PRNG keys as their key data, scalars as
0-d arrays; the manifest keeps each leaf's kind) through a NumPy handler that
writes on the calling process, with Orbax's multiprocessing options naming
that process as the only one taking part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.serialization import tensorstore_utils

from jaxjob import hostlocal

__all__ = ["from_host", "options", "registry", "to_host"]


class _ThisProcessNumpyHandler(ocp.type_handlers.NumpyHandler):
    """Orbax's NumPy handler, writing on the calling process instead of process 0 only."""

    async def _background_serialize(
        self,
        values: Sequence[np.ndarray],
        infos: Sequence[Any],
        args: Sequence[Any] | None = None,
    ) -> None:
        writes = []
        for value, info, arg in zip(values, infos, args or [None] * len(values), strict=True):
            await info.await_path_creation()
            spec = tensorstore_utils.build_array_write_spec(
                info=info,
                arg=arg,
                global_shape=value.shape,
                local_shape=value.shape,
                dtype=value.dtype,
                use_ocdbt=False,
                process_index=None,
                metadata_key=self._metadata_key,
            )
            writes.append(self._open_and_write(value, spec.json, info.ts_context))
        await asyncio.gather(*writes)


def registry() -> Any:
    """The Orbax type-handler registry of private items: NumPy arrays only."""
    return ocp.type_handlers.create_type_handler_registry((np.ndarray, _ThisProcessNumpyHandler()))


def options() -> ocp.options.MultiprocessingOptions:
    """Orbax options making this process the only one that takes part."""
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"jaxjob_private_{me}"
    )


def to_host(leaf: Any, kind: Mapping[str, Any]) -> np.ndarray:
    """``leaf`` as the NumPy array a private directory stores.

    Raises:
        ValueError: For a ``jax.Array`` sharded over several processes' devices.
    """
    if kind["kind"] == "prng_key":
        return np.asarray(jax.random.key_data(leaf))
    if kind["kind"] == "jax":
        if not leaf.is_fully_addressable:
            raise ValueError(
                "a private (one process's) checkpoint cannot hold a jax.Array sharded over "
                "several processes' devices; checkpoint it with a node that every process saves"
            )
        return np.asarray(leaf)
    return np.asarray(leaf, dtype=hostlocal.dtype_of(kind))


def from_host(value: np.ndarray, kind: Mapping[str, Any], sharding: Any) -> Any:
    """The saved leaf back with its own type; ``jax.Array`` s go to ``sharding``."""
    if kind["kind"] in hostlocal.KINDS:
        return hostlocal.as_saved(np.asarray(value), kind)
    array = jax.device_put(value, sharding)
    if kind["kind"] == "prng_key":
        return jax.random.wrap_key_data(array, impl=kind["impl"])
    return array
