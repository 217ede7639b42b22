"""One checkpoint directory's leaves as stored: encoded for a save, restored and checked.

A checkpoint directory ``<db_prefix>/<node>.<epoch>/`` is one Orbax
``CompositeCheckpointHandler`` checkpoint with these items:

* ``state``: the persistent leaves, a flat mapping from stored name to array
  (Orbax ``PyTreeCheckpointHandler``, OCDBT storage);
* ``outputs`` (optional): the epoch outputs that the job's stop conditions
  read, so that auto-resume can re-evaluate them;
* ``jaxjob``: the manifest (:mod:`jaxjob._src.checkpoint.manifest`): tree structures and one
  :class:`~jaxjob._src.checkpoint.leaf_spec.LeafSpec` per leaf.

How leaves are stored is the codec's business (:mod:`jaxjob._src.checkpoint.codec`): a
shared checkpoint (every process writes its part) or a private one (one
process writes it alone). Orbax commits the directory when every process
has written its part (:mod:`jaxjob._src.internals.orbax_commit`: a durable rename on local
disk, a commit file on object stores). Orbax is reached through one handle,
:class:`~jaxjob._src.checkpoint.io.CheckpointIO`, which this module gives the
leaves as stored. Nothing is unpickled or executed when reading.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import fs, memory
from jaxjob._src.base.errors import CorruptCheckpointError
from jaxjob._src.base.leaves import Kind
from jaxjob._src.checkpoint import checksum, codec, host_budget, hostlocal, keypaths, leaf_check
from jaxjob._src.checkpoint import targets as targets_lib
from jaxjob._src.checkpoint.io import CheckpointIO
from jaxjob._src.checkpoint.leaf_spec import LeafSpec
from jaxjob._src.checkpoint.manifest import (
    OUTPUTS,
    STATE,
    Manifest,
    same_devices,
)
from jaxjob._src.checkpoint.tree import unflatten
from jaxjob._src.internals import orbax_files

__all__ = ["OUTPUTS", "STATE", "codec_for", "encode", "nbytes", "stored_codec"]


def codec_for(private: bool, tier: str = "persistent") -> codec.Codec:
    """The codec of a private (one process's) or shared checkpoint of ``tier``.

    A private local-tier copy (one process of a multi-process job) keeps
    ``jax.Array`` leaves as arrays of this process's shards (:class:`~codec.LocalCodec`).
    """
    if private and tier == "local":
        return codec.LocalCodec()
    return codec.PrivateCodec() if private else codec.SharedCodec()


def stored_codec(manifest: Manifest) -> codec.Codec:
    """The codec the checkpoint of ``manifest`` was saved with (its owner and tier say)."""
    return codec_for(manifest.owner_process is not None, manifest.tier)


def nbytes(tree: Any) -> int:
    """Bytes of the array leaves of ``tree`` that this process holds."""
    total = 0
    one_process = jax.process_count() == 1  # every shard is this process's
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            total += np.asarray(leaf).nbytes
        elif one_process:
            total += leaf.nbytes
        else:
            total += sum(s.data.nbytes for s in leaf.addressable_shards if s.replica_id == 0)
    return total


def encode(
    manifest: Manifest, flat: Mapping[str, Mapping[str, Any]], store: codec.Codec
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each item's leaves as Orbax stores them, and digests every process must agree on.

    Host-local leaves become their per-process rows. In a multi-process job,
    a ``jax.Array`` that lives on this process only becomes a replicated
    global array; its digest (by key path) lets the processes check that they
    hold the same value. ``store`` is the writer's codec (:func:`codec_for`).
    """
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


def _rows(manifest: Manifest, specs: Iterable[LeafSpec], host_map: hostlocal.HostMap | None):
    if manifest.owner_process is not None:
        return codec.Rows(0)
    local = [spec.path for spec in specs if spec.host_local]
    if not local:
        return codec.Rows(manifest.process_count)
    row = hostlocal.row_for_this_process(host_map, manifest.process_count, local)
    return codec.Rows(manifest.process_count, row)


def restore_selected(
    reader: CheckpointIO,
    path: str,
    manifest: Manifest,
    chosen: Mapping[str, keypaths.Selection],
    *,
    item: str = STATE,
    targets: Mapping[str, Any] | None = None,
    sharding: Any = None,
    host_map: hostlocal.HostMap | None = None,
    filtered_states: bool = False,
    max_host_bytes: int | None = None,
) -> dict[str, Any]:
    """Restores the selected subtrees of one item of the checkpoint directory ``path``, by key.

    Only their leaves are read. A key with a target (a pytree of
    ``jax.ShapeDtypeStruct`` or arrays) is checked against the checkpoint and
    restored with the target's pytree types and, where it gives them,
    shardings (:mod:`jaxjob._src.checkpoint.targets`). Any other key comes back with the
    saved tree structure (dicts, lists, tuples, None; custom nodes as dicts
    or lists) and its saved leaf types. ``jax.Array`` leaves without a
    target sharding go where ``sharding`` says (a Sharding, or a mapping
    from key or name to a Sharding or a pytree prefix of them), by default
    JAX's default device. Host-local leaves come back as this process's own
    copy, or as the copy of the saved process that ``host_map`` gives for it.
    With ``filtered_states`` (``jaxjob.restore``), an ``nnx.State`` target
    filtered by Variable type reads only its own Variables. With
    ``max_host_bytes`` the leaves are read in groups of at most that many
    bytes, one after the other (:mod:`jaxjob._src.checkpoint.host_budget`).

    Raises:
        CorruptCheckpointError: If a leaf read does not match its checksum or
            does not decode (naming the leaf, the epoch and the file).
        ValueError: If a target's structure, shape or dtype differs from the
            checkpoint (naming the key path), or host-local leaves were saved
            by another number of processes and ``host_map`` is None.
    """
    store = stored_codec(manifest)
    where = f"the checkpoint of epoch {manifest.epoch} at {path!r}"
    _check_shards_here(path, manifest)
    targets = targets or {}
    plans = {
        key: targets_lib.plan(
            sel,
            manifest.leaves,
            targets_lib.ShardingRule.of(sharding, key, sel.name, sel.segments),
            target=targets.get(key),
            has_target=key in targets,
            where=where,
            subset=filtered_states,
        )
        for key, sel in chosen.items()
    }
    abstracts = {n: a for p in plans.values() for n, a in p.abstracts.items()}
    all_specs = [manifest.leaves[n] for n in abstracts]
    rows = _rows(manifest, all_specs, host_map)
    restore_item = {s.name: store.target(s, abstracts[s.name], rows) for s in all_specs}
    groups = [list(restore_item)]  # without a budget: one read of every leaf
    if max_host_bytes is not None:
        memory.return_freed_buffers()
        sizes = {n: host_budget.host_bytes(t) for n, t in restore_item.items()}
        groups = host_budget.groups(sizes, max_host_bytes) or [[]]
    records: Mapping[str, Any] | None = None  # read after the first read, as without groups
    restored: dict[str, Any] = {}
    for group in groups:
        part = {n: restore_item[n] for n in group}
        volume = 16 * sum(math.prod(manifest.leaves[n].shape) for n in group)  # <=16 B an element
        read = fs.bounded(
            path,
            "the read",
            lambda part=part: _read(reader, path, manifest, item, part),
            timeout_s=fs.transfer_bound_s(path, volume) if fs.is_remote(path) else None,
        )
        records = checksum.read_records(path, manifest) if records is None else records
        _check(path, manifest, item, [manifest.leaves[n] for n in group], read, records)
        restored.update(read)
    leaves = {s.name: store.decode(restored[s.name], s, abstracts[s.name], rows) for s in all_specs}
    return {key: p.build(leaves) for key, p in plans.items()}


def _read(reader: CheckpointIO, path: str, manifest: Manifest, item: str, restore_item: dict):
    """Orbax's restore of ``restore_item``; bytes that do not decode raise CorruptCheckpointError.

    On a read error each requested leaf is read again alone, on this process,
    to name the damaged ones; an error that no leaf reproduces is re-raised.
    """
    try:
        return reader.restore(path, item, restore_item)
    except leaf_check.READ_ERRORS as err:
        if isinstance(err, ValueError) and "stored shape" in str(err):  # Orbax's words
            raise CorruptCheckpointError(
                f"the manifest of {path!r} declares shapes that its stored arrays do not have "
                f"(a damaged or hand-edited manifest; nothing was allocated): {err}"
            ) from err
        lines = _damaged(path, manifest, item, restore_item)
        if not lines:
            raise
        raise checksum.corrupt(manifest.epoch, path, "; ".join(lines)) from err


def _damaged(path: str, manifest: Manifest, item: str, names: Iterable[str]) -> list[str]:
    """Reads each named leaf alone (this process only) and returns a line per damaged one."""
    with CheckpointIO.alone(path) as reader:
        records = checksum.read_records(path, manifest)
        lines: list[str] = []
        for name in names:
            spec = manifest.leaves[name]
            lines += leaf_check.check_leaf(reader, path, item, spec, manifest, records)
        return lines


def _shards_only(manifest: Manifest) -> bool:
    """Whether ``manifest`` 's arrays hold one process's shards only (a local-tier copy)."""
    return manifest.tier == "local" and manifest.owner_process is not None


def _check_shards_here(path: str, manifest: Manifest) -> None:
    """Refuses to read one process's local copy on other devices or another process.

    Raises:
        ValueError: Naming the checkpoint, the process counts and what to do.
    """
    if not _shards_only(manifest) or manifest.process_count == 1:
        return
    if same_devices(manifest) and manifest.owner_process == jax.process_index():
        return
    raise ValueError(
        f"{path!r} is the local-tier copy of process {manifest.owner_process} of a "
        f"{manifest.process_count}-process job: it holds that process's shards only, readable "
        f"by that process on the same devices (this is process {jax.process_index()} of "
        f"{jax.process_count()}); restore the persistent tier (the db_prefix) instead"
    )


def _check(
    path: str,
    manifest: Manifest,
    item: str,
    specs: Iterable[LeafSpec],
    restored: Mapping[str, Any],
    records: Mapping[str, Any],
) -> None:
    """Checks every restored shard against its checksum (CorruptCheckpointError if one differs).

    A local-tier copy's every restored shard must have a record: one the
    copy does not hold (another sharding than it was saved with) is refused.
    """
    lines = []
    for spec in specs:
        value = restored[spec.name]
        if _shards_only(manifest) and isinstance(value, jax.Array):
            for index in checksum.uncovered(value, records.get(spec.name, [])):
                lines.append(
                    f"{checksum.key_path(manifest, item, spec.name)}: shard {index} is not in "
                    "this local copy (restored onto another sharding than it was saved with)"
                )
        bad, _ = checksum.mismatches(value, records.get(spec.name, []))
        lines += [
            checksum.describe(path, item, spec, manifest, r, "checksum mismatch") for r in bad
        ]
    if lines:
        raise checksum.corrupt(manifest.epoch, path, "; ".join(lines))


def saved_shapes(manifest: Manifest) -> dict[str, Any]:
    """Shapes and dtypes of every saved state leaf (``jax.ShapeDtypeStruct`` s), reading no data."""
    abstract = {spec.name: spec.abstract() for spec in manifest.leaves.values()}
    return {name: unflatten(s, abstract) for name, s in manifest.state.items()}


def saved_targets(path: str, manifest: Manifest) -> dict[tuple[str, ...], Any] | None:
    """Every saved ``jax.Array`` state leaf as it was saved, by key path; None on other devices.

    On the devices that saved it (:func:`~jaxjob._src.checkpoint.manifest.same_devices`)
    each leaf gets the sharding it was saved with, which is the one the
    saving job's next epoch read: a resume can restore onto it without
    tracing the job. None if this job runs on other devices or a leaf's
    sharding is not recorded (then the job's own shardings are traced).

    Returns:
        ``(name, *segments)`` (the key path, as
        :func:`~jaxjob._src.checkpoint.keypaths.leaf_names` gives it) ->
        ``jax.ShapeDtypeStruct`` with the leaf's shape, dtype and sharding.
    """
    if not same_devices(manifest):
        return None
    shardings = orbax_files.saved_named_shardings(path)
    found: dict[tuple[str, ...], Any] = {}
    for name, structure in manifest.state.items():
        for segments, stored in keypaths.leaf_names(structure, (name,)):
            spec = manifest.leaves[stored]
            if spec.host_local:
                continue
            sharding = _leaf_sharding(shardings.get(stored), spec)
            if sharding is None:
                return None
            abstract = spec.abstract()
            found[segments] = jax.ShapeDtypeStruct(
                abstract.shape, abstract.dtype, sharding=sharding
            )
    return found


def _leaf_sharding(saved: Any, spec: LeafSpec) -> Any:
    """The sharding of the leaf ``spec``: its recorded local device, or Orbax's record.

    None if unknown: e.g. a process-local array on several devices, which a
    multi-process save stores as a host copy.

    A PRNG key is stored as its key data, one dimension more, unsharded.
    """
    if spec.device is not None:
        local = jax.local_devices()
        return (
            jax.sharding.SingleDeviceSharding(local[spec.device])
            if spec.device < len(local)
            else None
        )
    if saved is None or hostlocal.is_host_copy(saved):
        return None
    if spec.kind != Kind.PRNG_KEY:
        return saved
    rank = len(spec.shape)
    if any(p is not None for p in tuple(saved.spec)[rank:]):
        return None
    return jax.sharding.NamedSharding(saved.mesh, jax.sharding.PartitionSpec(*saved.spec[:rank]))
