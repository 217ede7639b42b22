"""Writing and reading one checkpoint directory through Orbax.

A checkpoint directory ``<db_prefix>/<node>.<epoch>/`` is one Orbax
``CompositeCheckpointHandler`` checkpoint with these items:

* ``state``: the persistent leaves, a flat mapping from stored name to array
  (Orbax ``PyTreeCheckpointHandler``, OCDBT storage);
* ``outputs`` (optional): the epoch outputs that the job's stop conditions
  read, so that auto-resume can re-evaluate them;
* ``jaxjob``: the manifest (:mod:`jaxjob.manifest`): tree structures and one
  :class:`~jaxjob.codec.LeafSpec` per leaf.

How leaves are stored is the codec's business (:mod:`jaxjob.codec`): a
shared checkpoint (every process writes its part) or a private one (one
process writes it alone). Orbax commits the directory when every process
has written its part (:mod:`jaxjob.orbax_adapter`: a durable rename on local
disk, a commit file on object stores). Nothing is unpickled or executed
when reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxjob import codec, faults, hostlocal, orbax_adapter
from jaxjob.errors import CorruptCheckpointError
from jaxjob.manifest import MANIFEST_FILE, MANIFEST_ITEM, OUTPUTS, STATE, Manifest

__all__ = ["OUTPUTS", "STATE", "composite_handler", "encode", "nbytes", "restore", "save_args"]

HostMap = hostlocal.HostMap


def codec_for(private: bool) -> codec.Codec:
    """The codec of a private (one process's) or shared checkpoint."""
    return codec.PrivateCodec() if private else codec.SharedCodec()


class _FailPoint:
    """A commit future whose wait passes the fail point ``name`` (:mod:`jaxjob.faults`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def result(self, timeout: float | None = None) -> None:
        faults.point(self.name)


class _Handler(ocp.CompositeCheckpointHandler):
    """Orbax's composite handler with the save's fail points.

    ``save.copy`` as the device-to-host copy starts; Orbax's background thread
    waits on the returned futures in order, so the first one passes
    ``save.write`` as it starts waiting for the write, the last one
    ``save.commit`` once every write is done and before the commit.
    """

    async def async_save(self, directory: Any, args: Any) -> list[Any]:
        faults.point("save.copy")
        futures = await super().async_save(directory, args) or []
        return [_FailPoint("save.write"), *futures, _FailPoint("save.commit")]


@ocp.args.register_with_handler(_Handler, for_save=True, for_restore=True)
class _HandlerArgs(ocp.args.Composite):
    """Registers :class:`_Handler` with Orbax (it takes ``ocp.args.Composite`` like its base)."""


def composite_handler(path: str, private: bool) -> ocp.CompositeCheckpointHandler:
    """The Orbax handler of checkpoint directories under ``path``, each item's handler registered.

    With ``private`` (in a multi-process job) this process alone writes or reads it.
    """
    atomicity = orbax_adapter.commit_file_options(path)
    if not (private and jax.process_count() > 1):
        return _Handler(
            composite_options=ocp.CompositeOptions(atomicity_options=atomicity),
            **{
                STATE: ocp.PyTreeCheckpointHandler(),
                OUTPUTS: ocp.PyTreeCheckpointHandler(),
                MANIFEST_ITEM: ocp.JsonCheckpointHandler(MANIFEST_FILE),
            },
        )
    options, registry = orbax_adapter.private_options(), orbax_adapter.private_registry()

    def pytree() -> ocp.PyTreeCheckpointHandler:
        return ocp.PyTreeCheckpointHandler(
            use_ocdbt=False, multiprocessing_options=options, type_handler_registry=registry
        )

    return _Handler(
        composite_options=ocp.CompositeOptions(
            multiprocessing_options=options,
            atomicity_options=atomicity,
            # Orbax keys the signals of asynchronous directory creation by a per-process
            # counter in the job-wide key-value store: two processes would collide.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        ),
        **{
            STATE: pytree(),
            OUTPUTS: pytree(),
            MANIFEST_ITEM: ocp.JsonCheckpointHandler(
                MANIFEST_FILE, multiprocessing_options=options
            ),
        },
    )


def nbytes(tree: Any) -> int:
    """Bytes of the array leaves of ``tree`` that this process holds."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            total += sum(s.data.nbytes for s in leaf.addressable_shards if s.replica_id == 0)
        else:
            total += np.asarray(leaf).nbytes
    return total


def encode(
    manifest: Manifest, flat: Mapping[str, Mapping[str, Any]], private: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each item's leaves as Orbax stores them, and digests every process must agree on.

    Host-local leaves become their per-process rows. In a multi-process job,
    a ``jax.Array`` that lives on this process only becomes a replicated
    global array; its digest (by key path) lets the processes check that they
    hold the same value.
    """
    store = codec_for(private)
    digests: dict[str, str] = {}
    encoded: dict[str, dict[str, Any]] = {}
    for item, leaves in flat.items():
        encoded[item] = {}
        for name, leaf in leaves.items():
            spec = manifest.leaves[name]
            encoded[item][name], digest = store.encode(leaf, spec)
            if digest is not None:
                digests[spec.path] = digest
    return encoded, digests


def save_args(encoded: Mapping[str, Mapping[str, Any]], manifest: Manifest) -> ocp.args.Composite:
    """Orbax arguments that save one checkpoint directory (trees from :func:`encode`)."""
    items: dict[str, Any] = {MANIFEST_ITEM: ocp.args.JsonSave(manifest.to_json())}
    for item in (STATE, OUTPUTS):
        if encoded.get(item):  # Orbax refuses an empty tree
            items[item] = ocp.args.PyTreeSave(dict(encoded[item]))
    return ocp.args.Composite(**items)


def default_sharding(sharding: Any, name: str) -> jax.sharding.Sharding:
    """Where the ``jax.Array`` leaves of ``name`` go: ``sharding``, or JAX's default device.

    Raises:
        TypeError: If the sharding given for ``name`` is not a ``jax.sharding.Sharding``.
    """
    if isinstance(sharding, Mapping):
        sharding = sharding.get(name)
    if sharding is None:
        device = jax.config.jax_default_device
        if not isinstance(device, jax.Device):
            device = jax.local_devices()[0]
        return jax.sharding.SingleDeviceSharding(device)
    if not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            f"sharding for {name!r} must be a jax.sharding.Sharding, got {type(sharding).__name__}"
        )
    return sharding


def _target_leaves(
    name: str, target: Any, specs: list[codec.LeafSpec], where: str
) -> list[jax.ShapeDtypeStruct]:
    """The target's leaves, checked against the saved ones (ValueError naming the key path)."""
    flat = jax.tree_util.tree_flatten_with_path(target)[0]
    wanted = [f"[{name!r}]{jax.tree_util.keystr(path)}" for path, _ in flat]
    saved = [spec.path for spec in specs]
    if wanted != saved:
        raise ValueError(
            f"structure mismatch for {name!r} in {where}: the target has leaves the checkpoint "
            f"lacks {[w for w in wanted if w not in saved]} and the checkpoint has leaves the "
            f"target lacks {[s for s in saved if s not in wanted]}"
            + ("" if set(wanted) != set(saved) else " (the same leaves in another order)")
        )
    for (_, leaf), spec in zip(flat, specs, strict=True):
        _check_leaf(leaf, spec, where)
    return [leaf for _, leaf in flat]


def _check_leaf(leaf: Any, spec: codec.LeafSpec, where: str) -> None:
    saved = spec.abstract()
    shape, dtype = tuple(np.shape(leaf)), getattr(leaf, "dtype", None)
    if shape != saved.shape:
        raise ValueError(
            f"{spec.path}: shape mismatch: target {shape}, checkpoint {saved.shape} ({where})"
        )
    if dtype is not None and dtype != saved.dtype:
        raise ValueError(
            f"{spec.path}: dtype mismatch: target {dtype}, checkpoint {saved.dtype} ({where})"
        )


def _abstract(leaf: Any, fallback: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    sharding = getattr(leaf, "sharding", None) or fallback
    return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)


def _rows(manifest: Manifest, specs: Iterable[codec.LeafSpec], host_map: HostMap | None):
    if manifest.owner_process is not None:
        return codec.Rows(0)
    local = [spec.path for spec in specs if spec.host_local]
    if not local:
        return codec.Rows(manifest.process_count)
    row = hostlocal.row_for_this_process(host_map, manifest.process_count, str(local))
    return codec.Rows(manifest.process_count, row)


def restore(
    checkpointer: ocp.Checkpointer,
    path: str,
    manifest: Manifest,
    names: Iterable[str],
    *,
    item: str = STATE,
    targets: Mapping[str, Any] | None = None,
    sharding: Any = None,
    host_map: HostMap | None = None,
) -> dict[str, Any]:
    """Restores the named entries of one item of the checkpoint directory ``path``.

    Only the requested leaves are read. A name with a target (a pytree of
    ``jax.ShapeDtypeStruct`` with shardings, as the init group's abstract
    trace gives) is checked against the checkpoint and restored with the
    target's pytree types and shardings. Any other name comes back with the
    saved tree structure (dicts, lists, tuples, None; custom nodes as dicts
    or lists) and its saved leaf types; its ``jax.Array`` leaves go to
    ``sharding`` (a Sharding, or a mapping from name to Sharding), by default
    JAX's default device. Host-local leaves come back as this process's own
    copy, or as the copy of the saved process that ``host_map`` gives for it.

    Raises:
        ValueError: If a target's structure, shape or dtype differs from the
            checkpoint (naming the key path), or host-local leaves were saved
            by another number of processes and ``host_map`` is None.
    """
    names = list(names)
    store = codec_for(manifest.owner_process is not None)
    specs = {name: manifest.specs(item, name) for name in names}
    all_specs = [spec for group in specs.values() for spec in group]
    rows = _rows(manifest, all_specs, host_map)
    where = f"the checkpoint of epoch {manifest.epoch} at {path!r}"
    abstracts: dict[str, jax.ShapeDtypeStruct] = {}
    for name in names:
        fallback = default_sharding(sharding, name)
        if targets is not None and name in targets:
            leaves = _target_leaves(name, targets[name], specs[name], where)
        else:
            leaves = [spec.abstract() for spec in specs[name]]
        for spec, leaf in zip(specs[name], leaves, strict=True):
            abstracts[spec.name] = _abstract(leaf, fallback)
    restore_item = {s.name: store.target(s, abstracts[s.name], rows) for s in all_specs}
    restored = _read(checkpointer, path, item, restore_item)
    leaves = {s.name: store.decode(restored[s.name], s, abstracts[s.name], rows) for s in all_specs}
    result = {}
    for name in names:
        if targets is not None and name in targets:
            treedef = jax.tree.structure(targets[name])
            result[name] = jax.tree.unflatten(treedef, [leaves[s.name] for s in specs[name]])
        else:
            result[name] = codec.unflatten(manifest.structure(item)[name], leaves)
    return result


def _read(checkpointer: ocp.Checkpointer, path: str, item: str, restore_item: dict[str, Any]):
    if not restore_item:
        return {}
    args = ocp.args.PyTreeRestore(
        item=restore_item,
        restore_args=ocp.checkpoint_utils.construct_restore_args(restore_item),
        partial_restore=True,
    )
    try:
        return checkpointer.restore(path, args=ocp.args.Composite(**{item: args}))[item]
    except ValueError as err:
        if "stored shape" not in str(err):  # Orbax's words for an array of another shape
            raise
        raise CorruptCheckpointError(
            f"the manifest of {path!r} declares shapes that its stored arrays do not have "
            f"(a damaged or hand-edited manifest; nothing was allocated): {err}"
        ) from err


def saved_shapes(manifest: Manifest) -> dict[str, Any]:
    """Shapes and dtypes of every saved state leaf (``jax.ShapeDtypeStruct`` s), reading no data."""
    abstract = {spec.name: spec.abstract() for spec in manifest.leaves.values()}
    return {name: codec.unflatten(s, abstract) for name, s in manifest.state.items()}
