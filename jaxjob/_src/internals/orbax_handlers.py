"""Orbax's handlers where jaxjob needs more: checksum files, one process's writes, fail points.

* **Checksum files** (:class:`ManifestHandler`). Each process writes its
  checksums beside the manifest, so they commit with the checkpoint: the
  process that commits a local directory from its
  :class:`~jaxjob._src.internals.orbax_commit.DurableRename`, hashing while
  the commit flushes the data; every other one inside Orbax's write, once its
  background thread has computed them. The JSON handler writes on the primary
  host only and has no hook for that; its private ``_save_fn`` is overridden.
* **Private checkpoints** (one process writes a node's checkpoint alone).
  Orbax's NumPy handler writes only on the primary host, with no option to
  write on the calling process; :class:`_ThisProcessNumpyHandler` overrides
  its private ``_background_serialize``.
* **A save jaxjob observes** (:class:`CompositeHandler`): Orbax's composite
  handler with no hook as a save starts nor on the futures its background
  thread waits on (jaxjob's fail points, and writes waited for together);
  its ``async_save`` is overridden. :func:`members` opens the chained futures
  among them (Orbax's PyTree handler returns its writes as one ``ChainedFuture``,
  which stops at the first that fails), so that every write of a failed save
  is waited for before its directory is removed.

Private Orbax names used here: ``CompositeCheckpointHandler.async_save``
(overridden, a public method), ``future.ChainedFuture`` and its
``_futures``, ``JsonCheckpointHandler._save_fn``
(overridden), ``type_handlers.NumpyHandler._background_serialize``
(re-implemented), its ``_metadata_key`` and ``_open_and_write``,
``ParamInfo.await_path_creation`` and ``ts_context``,
``tensorstore_utils.build_array_write_spec`` (and ``ArrayWriteSpec.json``)
and ``async_path.write_text``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src.futures import future as orbax_future
from orbax.checkpoint._src.path import async_path
from orbax.checkpoint._src.serialization import tensorstore_utils

from jaxjob._src.internals import orbax_commit, orbax_version

__all__ = [
    "CompositeHandler",
    "ManifestHandler",
    "ManifestRestore",
    "ManifestSave",
    "members",
    "private_registry",
]

orbax_version.check()


class ManifestHandler(ocp.JsonCheckpointHandler):
    """Orbax's JSON handler for the manifest; every process also writes its checksum file.

    A document with a ``checksum_file()`` method
    (a pending manifest, made by the save) gives this process's
    file: written by the commit of a DurableRename that this process runs
    (hashed while the commit flushes the data), else here, waiting in Orbax's
    background thread for its checksums.
    """

    async def _save_fn(self, x: Any, directory: epath.Path) -> None:
        await super()._save_fn(dict(x), directory)
        if not hasattr(x, "checksum_file"):
            return
        if orbax_commit.defer_checksums(os.fspath(directory), x):  # written at the commit
            return
        name, text = await asyncio.to_thread(x.checksum_file)
        await async_path.write_text(directory / name, text)


# Orbax records each item handler's class path (``__module__`` + ``__qualname__``) in every
# checkpoint's ``_CHECKPOINT_METADATA``. Every checkpoint written before the move to
# ``jaxjob._src`` says ``jaxjob.orbax_adapter.ManifestHandler``: keeping that name keeps new
# checkpoints byte-identical to old ones, and ``jaxjob/orbax_adapter.py`` keeps it importable.
ManifestHandler.__module__ = "jaxjob.orbax_adapter"


@ocp.args.register_with_handler(ManifestHandler, for_save=True)
@dataclasses.dataclass
class ManifestSave(ocp.args.JsonSave):
    """Saves the manifest item through :class:`ManifestHandler`."""


# Never constructed by jaxjob (the manifest is read as a file), but not dead: Orbax's composite
# handler accepts ManifestSave for a ManifestHandler item only when the handler has both a save
# and a restore argument registered; without this one every save fails with "does not match with
# any registered handler".
@ocp.args.register_with_handler(ManifestHandler, for_restore=True)
@dataclasses.dataclass
class ManifestRestore(ocp.args.JsonRestore):
    """Restores the manifest item through :class:`ManifestHandler` (registered, never built)."""


class _ThisProcessNumpyHandler(ocp.type_handlers.NumpyHandler):
    """Orbax's NumPy handler, writing on the calling process instead of the primary host only."""

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


def private_registry() -> Any:
    """The Orbax type-handler registry of private items: NumPy arrays and ``jax.Array`` s.

    A ``jax.Array`` (only in a local-tier copy: other private checkpoints
    store NumPy host copies) is written by this process alone, one copy of
    each shard it holds (``primary_host=None``, ``replica_id=None``: the
    replica of its first shard), the way Orbax's own local checkpoints are.
    """
    arrays = ocp.type_handlers.ArrayHandler(
        primary_host=None, replica_id=None, use_replica_parallel=False
    )
    return ocp.type_handlers.create_type_handler_registry(
        (np.ndarray, _ThisProcessNumpyHandler()), (jax.Array, arrays)
    )


def _no_hook(directory: Any) -> None:
    """A save's start, unobserved."""


def _as_they_are(directory: Any, futures: list[Any]) -> list[Any]:
    """A save's futures, waited on as Orbax returns them."""
    return futures


class CompositeHandler(ocp.CompositeCheckpointHandler):
    """Orbax's composite handler, its saves observed as they start and as they are waited on.

    ``started(directory)`` is called as a save starts, before Orbax's
    device-to-host copy; ``settle(directory, futures)`` gets the futures
    Orbax returns and gives those that Orbax's background thread waits on,
    in order, before the commit. Both are set on the instance.
    """

    started: Callable[[Any], None] = staticmethod(_no_hook)
    settle: Callable[[Any, list[Any]], list[Any]] = staticmethod(_as_they_are)

    async def async_save(self, directory: Any, args: Any) -> list[Any]:
        self.started(directory)
        futures = await super().async_save(directory, args) or []
        return self.settle(directory, futures)


def members(futures: Sequence[Any]) -> list[Any]:
    """The futures that ``futures`` wait on: each chained future's members, recursively.

    Orbax's ``ChainedFuture`` waits on its members in order and stops at the
    first that fails, while the later ones (TensorStore's writes) go on.

    Example:
        >>> from orbax.checkpoint._src.futures import future
        >>> noop = future.NoopFuture()
        >>> chained = future.ChainedFuture([noop, future.ChainedFuture([noop], cb=print)], cb=print)
        >>> len(members([chained, noop]))
        3
    """
    found = []
    for each in futures:
        if isinstance(each, orbax_future.ChainedFuture):
            found.extend(members(each._futures))
        else:
            found.append(each)
    return found


@ocp.args.register_with_handler(CompositeHandler, for_save=True, for_restore=True)
class _CompositeArgs(ocp.args.Composite):
    """Registers :class:`CompositeHandler` (it takes ``ocp.args.Composite`` like its base)."""
