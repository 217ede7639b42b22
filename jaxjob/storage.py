"""The on-disk format of one checkpoint directory, written and read through Orbax.

A checkpoint directory ``<db_prefix>/<node>.<epoch>/`` is one Orbax
``CompositeCheckpointHandler`` checkpoint with these items:

* ``state``: the persistent leaves, one top-level entry per workspace name
  (Orbax ``PyTreeCheckpointHandler``, OCDBT storage);
* ``outputs`` (optional): the epoch outputs that the job's stop conditions
  read, so that auto-resume can re-evaluate them;
* ``jaxjob``: a JSON manifest: format version, epoch, node, names and, per
  leaf, its kind (``jax``, ``prng_key``, ``numpy``, ``numpy_scalar``,
  ``python``) and dtype, so a leaf comes back with its own type even without
  model code.

``jax.Array`` leaves are global: Orbax writes and reads each host's shards on
that host. NumPy arrays and NumPy/Python scalars are host-local: each process
has its own copy (a data-loader cursor, say). Such a leaf is saved as a
``uint8`` array of shape ``(process_count, nbytes)`` with one row per process,
sharded so that each process writes (and, on resume, reads) only its own row;
its true shape and dtype are in the manifest. Resuming host-local leaves on
a different process count needs a ``host_map`` saying which saved process's
copy each new process gets.

Orbax writes to a temporary directory and renames it when every host has
finished, so a directory with the final name is committed. Nothing is
unpickled or executed when reading.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxjob import hostlocal
from jaxjob import private as privatedir
from jaxjob.layout import MANIFEST_ITEM

__all__ = [
    "FORMAT",
    "describe",
    "nbytes",
    "read_manifest",
    "restore_items",
    "saved_shapes",
]

FORMAT = 2
STATE_ITEM = "state"
OUTPUTS_ITEM = "outputs"
HOST_LOCAL_KINDS = hostlocal.KINDS


def _token(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def param_name(name: str, path: Iterable[Any]) -> str:
    """Orbax's name for the leaf at ``path`` under workspace name ``name``."""
    return ".".join([name, *(_token(k) for k in path)])


def _kind(leaf: Any) -> dict[str, str]:
    if isinstance(leaf, jax.Array):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return {"kind": "prng_key", "impl": str(jax.random.key_impl(leaf))}
        return {"kind": "jax", "dtype": str(leaf.dtype)}
    if isinstance(leaf, np.ndarray | np.generic) and not leaf.dtype.hasobject:
        kind = "numpy" if isinstance(leaf, np.ndarray) else "numpy_scalar"
        return {"kind": kind, "dtype": str(leaf.dtype), "shape": list(np.shape(leaf))}
    if isinstance(leaf, bool | int | float):
        return {"kind": "python", "dtype": type(leaf).__name__, "shape": []}
    raise TypeError(
        f"cannot checkpoint a leaf of type {type(leaf).__name__}; leaves must be jax.Array, "
        "NumPy arrays (not of object dtype) or scalars, or Python bool/int/float"
    )


def describe(tree: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per-leaf kinds of a ``name -> pytree`` mapping, keyed by Orbax leaf name.

    Raises:
        TypeError: Naming the key path of a leaf that cannot be checkpointed.
    """
    kinds: dict[str, dict[str, str]] = {}
    for name, value in tree.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            try:
                kinds[param_name(name, path)] = _kind(leaf)
            except TypeError as err:
                where = f"[{name!r}]{jax.tree_util.keystr(path)}"
                raise TypeError(f"workspace leaf {where}: {err}") from None
    return kinds


def nbytes(tree: Any) -> int:
    """Bytes of the array leaves of ``tree`` that this process holds."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            total += sum(s.data.nbytes for s in leaf.addressable_shards if s.replica_id == 0)
        else:
            total += np.asarray(leaf).nbytes
    return total


def save_args(
    state: Mapping[str, Any], outputs: Mapping[str, Any], manifest: dict[str, Any]
) -> ocp.args.Composite:
    """Orbax arguments that save one checkpoint directory (trees from :func:`encode`)."""
    items: dict[str, Any] = {
        STATE_ITEM: ocp.args.PyTreeSave(dict(state)),
        MANIFEST_ITEM: ocp.args.JsonSave(manifest),
    }
    if outputs:
        items[OUTPUTS_ITEM] = ocp.args.PyTreeSave(dict(outputs))
    return ocp.args.Composite(**items)


def encode(
    tree: Mapping[str, Any], kinds: Mapping[str, Any], *, private: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """``tree`` as Orbax saves it, and digests of the leaves every process must agree on.

    Host-local leaves become their per-process rows. In a multi-process job,
    a ``jax.Array`` that lives on this process only becomes a replicated
    global array; its digest is returned so the processes can check that
    they hold the same value. For a private directory, ``jax.Array`` s are
    copied to NumPy and the rest is kept as it is.
    """
    digests: dict[str, str] = {}
    multi = jax.process_count() > 1

    def convert(name: str, path: Any, leaf: Any) -> Any:
        key = param_name(name, path)
        if private:
            return privatedir.to_host(leaf, kinds[key])
        if kinds[key]["kind"] in HOST_LOCAL_KINDS:
            return hostlocal.encode(leaf, kinds[key])
        if multi and leaf.is_fully_addressable:
            leaf, digests[f"[{name!r}]{jax.tree_util.keystr(path)}"] = hostlocal.replicate(leaf)
        return leaf

    encoded = {
        name: jax.tree_util.tree_map_with_path(lambda p, x, n=name: convert(n, p, x), value)
        for name, value in tree.items()
    }
    return encoded, digests


def composite_handler(private: bool = False) -> ocp.CompositeCheckpointHandler:
    """The Orbax handler of a checkpoint directory, with each item's handler registered.

    With ``private`` (in a multi-process job) this process alone writes or reads it.
    """
    if not (private and jax.process_count() > 1):
        return ocp.CompositeCheckpointHandler(
            **{
                STATE_ITEM: ocp.PyTreeCheckpointHandler(),
                OUTPUTS_ITEM: ocp.PyTreeCheckpointHandler(),
                MANIFEST_ITEM: ocp.JsonCheckpointHandler(),
            }
        )
    options, registry = privatedir.options(), privatedir.registry()

    def pytree() -> ocp.PyTreeCheckpointHandler:
        return ocp.PyTreeCheckpointHandler(
            use_ocdbt=False, multiprocessing_options=options, type_handler_registry=registry
        )

    return ocp.CompositeCheckpointHandler(
        composite_options=ocp.CompositeOptions(
            multiprocessing_options=options,
            # Orbax keys the signals of asynchronous directory creation by a per-process
            # counter in the job-wide key-value store: two processes would collide.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        ),
        **{
            STATE_ITEM: pytree(),
            OUTPUTS_ITEM: pytree(),
            MANIFEST_ITEM: ocp.JsonCheckpointHandler(multiprocessing_options=options),
        },
    )


def _checkpointer(private: bool = False) -> ocp.Checkpointer:
    if private and jax.process_count() > 1:
        return ocp.Checkpointer(
            composite_handler(private), multiprocessing_options=privatedir.options()
        )
    return ocp.Checkpointer(composite_handler())


def read_manifest(path: str) -> dict[str, Any]:
    """Reads the JSON manifest of a committed checkpoint directory.

    Each process reads it on its own, without waiting on the others.

    Raises:
        FileNotFoundError: If ``path`` is not a committed jaxjob checkpoint.
    """
    if not os.path.isdir(os.path.join(path, MANIFEST_ITEM)):
        raise FileNotFoundError(
            f"{path!r} is not a committed jaxjob checkpoint directory (no {MANIFEST_ITEM}/ item)"
        )
    restored = _checkpointer(private=True).restore(
        os.path.abspath(path), args=ocp.args.Composite(**{MANIFEST_ITEM: ocp.args.JsonRestore()})
    )
    manifest = restored[MANIFEST_ITEM]
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{path!r} has checkpoint format {manifest.get('format')!r}; "
            f"this jaxjob reads format {FORMAT}"
        )
    return manifest


def _saved_tree(path: str, item: str, private: bool = False) -> dict[str, Any]:
    metadata = _checkpointer(private).metadata(os.path.abspath(path)).item_metadata[item]
    return dict(metadata.tree)


def _default_sharding(sharding: Any, name: str) -> jax.sharding.Sharding:
    if isinstance(sharding, Mapping):
        sharding = sharding.get(name)
    if sharding is None:
        return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            f"sharding for {name!r} must be a jax.sharding.Sharding, got {type(sharding).__name__}"
        )
    return sharding


def _placeholder(meta: Any, kind: dict[str, Any], sharding: Any, saved_count: int, row) -> Any:
    """A restore target for a saved leaf, from its Orbax metadata and manifest kind."""
    if saved_count == 0:  # a private directory: every leaf is stored as a NumPy array
        return np.zeros(tuple(meta.shape), meta.dtype)
    if kind["kind"] in HOST_LOCAL_KINDS:
        return hostlocal.target(kind, saved_count, row)
    return jax.ShapeDtypeStruct(tuple(meta.shape), meta.dtype, sharding=sharding)


def _check_target(name: str, target: Any, saved: Any, kinds: Mapping[str, Any]) -> None:
    """Raises ValueError naming the key path where ``target`` and the saved leaves differ."""
    saved_leaves = {m.name: m for m in jax.tree.leaves(saved) if hasattr(m, "name")}
    wanted = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
        wanted[param_name(name, path)] = (f"[{name!r}]{jax.tree_util.keystr(path)}", leaf)
    missing = sorted(k for k in wanted if k not in saved_leaves)
    extra = sorted(k for k in saved_leaves if k not in wanted)
    if missing or extra:
        raise ValueError(
            f"structure mismatch for {name!r}: the target has leaves the checkpoint lacks "
            f"{[wanted[k][0] for k in missing]} and the checkpoint has leaves the target lacks "
            f"{extra}"
        )
    for key, (where, leaf) in wanted.items():
        _check_leaf(where, leaf, saved_leaves[key], kinds.get(key, {}))


def _check_leaf(where: str, leaf: Any, meta: Any, kind: Mapping[str, Any]) -> None:
    shape, dtype = tuple(np.shape(leaf)), getattr(leaf, "dtype", None)
    if kind.get("kind") in HOST_LOCAL_KINDS:
        meta = jax.ShapeDtypeStruct(tuple(kind["shape"]), hostlocal.dtype_of(kind))
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        shape, dtype = tuple(jax.eval_shape(jax.random.key_data, leaf).shape), None
        if kind.get("kind") != "prng_key":
            raise ValueError(f"{where}: the target is a PRNG key but the checkpoint holds {kind}")
    if shape != tuple(meta.shape):
        raise ValueError(f"{where}: shape mismatch: target {shape}, checkpoint {tuple(meta.shape)}")
    if dtype is not None and np.dtype(dtype) != np.dtype(meta.dtype):
        raise ValueError(f"{where}: dtype mismatch: target {dtype}, checkpoint {meta.dtype}")


def restore_items(
    path: str,
    names: Iterable[str],
    *,
    item: str = STATE_ITEM,
    targets: Mapping[str, Any] | None = None,
    sharding: Any = None,
    manifest: Mapping[str, Any] | None = None,
    host_map: hostlocal.HostMap | None = None,
    private: bool = False,
) -> dict[str, Any]:
    """Restores the named entries of one item of a checkpoint directory.

    Only the requested leaves are read. A name with a target (a pytree of
    ``jax.ShapeDtypeStruct`` with shardings, as the init group's abstract
    trace gives) is checked against the checkpoint and restored with the
    target's pytree types and shardings. Any other name comes back with the
    checkpoint's containers (dicts and lists) and its saved leaf types; its
    ``jax.Array`` leaves go to ``sharding`` (a Sharding, or a mapping from
    name to Sharding), by default this process's first device. Host-local
    leaves come back as this process's own copy, or as the copy of the saved
    process that ``host_map`` gives for it. A ``private`` directory is read
    by this process alone.

    Raises:
        ValueError: If a target's structure, shape or dtype differs from the
            checkpoint (naming the key path), or host-local leaves were saved
            by another number of processes and ``host_map`` is None.
    """
    path = os.path.abspath(path)
    manifest = manifest or read_manifest(path)
    names = list(names)
    if not names:
        return {}
    kinds = manifest["leaves"]
    saved = _saved_tree(path, item, private)
    count = 0 if private else int(manifest.get("process_count", 1))
    local = [
        m.name
        for n in names
        for m in jax.tree.leaves(saved[n])
        if kinds[m.name]["kind"] in HOST_LOCAL_KINDS
    ]
    row = hostlocal.row_for_this_process(host_map, count, local) if local and count else None
    restore_item: dict[str, Any] = {}
    for name in names:
        if targets is not None and name in targets:
            _check_target(name, targets[name], saved[name], kinds)
            if private:
                restore_item[name] = _private_targets(name, targets[name], saved[name], kinds)
            else:
                restore_item[name] = _host_targets(name, targets[name], kinds, count, row)
        else:
            shard = _default_sharding(sharding, name)
            restore_item[name] = jax.tree.map(
                lambda m, s=shard: _placeholder(m, kinds[m.name], s, count, row), saved[name]
            )
    restore_args = ocp.checkpoint_utils.construct_restore_args(restore_item)
    args = ocp.args.PyTreeRestore(
        item=restore_item, restore_args=restore_args, partial_restore=True
    )
    composite = ocp.args.Composite(**{item: args})
    restored = _checkpointer(private).restore(path, args=composite)[item]
    if private:
        return {
            name: _from_host(name, restored[name], kinds, (targets or {}).get(name), sharding)
            for name in names
        }
    return {name: _retyped(name, restored[name], kinds, row) for name in names}


def _private_targets(name: str, target: Any, saved: Any, kinds: Mapping[str, Any]) -> Any:
    """NumPy placeholders in ``target``'s pytree structure, for reading a private directory."""
    metas = {m.name: m for m in jax.tree.leaves(saved)}

    def placeholder(path: Any, _: Any) -> Any:
        key = param_name(name, path)
        return _placeholder(metas[key], kinds[key], None, 0, None)

    return jax.tree_util.tree_map_with_path(placeholder, target)


def _from_host(name: str, value: Any, kinds: Mapping[str, Any], target: Any, sharding: Any) -> Any:
    """A private directory's leaves with their saved types; jax.Arrays go to their devices."""
    default = _default_sharding(sharding, name)
    placements = {}
    if target is not None:
        for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
            placements[param_name(name, path)] = getattr(leaf, "sharding", None)

    def fix(path: Any, leaf: Any) -> Any:
        key = param_name(name, path)
        return privatedir.from_host(leaf, kinds[key], placements.get(key) or default)

    return jax.tree_util.tree_map_with_path(fix, value)


def _host_targets(name: str, target: Any, kinds: Mapping[str, Any], count: int, row) -> Any:
    """``target`` with its host-local leaves replaced by their per-process row targets."""

    def fix(path: Any, leaf: Any) -> Any:
        kind = kinds[param_name(name, path)]
        return hostlocal.target(kind, count, row) if kind["kind"] in HOST_LOCAL_KINDS else leaf

    return jax.tree_util.tree_map_with_path(fix, target)


def _retyped(name: str, value: Any, kinds: Mapping[str, Any], row: int | None) -> Any:
    def fix(path: Any, leaf: Any) -> Any:
        kind = kinds.get(param_name(name, path), {"kind": "jax"})
        if kind["kind"] in HOST_LOCAL_KINDS:
            return hostlocal.decode(leaf, kind, row)
        if kind["kind"] == "prng_key" and not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(leaf, impl=kind["impl"])
        return leaf

    return jax.tree_util.tree_map_with_path(fix, value)


def saved_shapes(path: str, *, private: bool = False) -> dict[str, Any]:
    """Shapes and dtypes of every saved state leaf (``jax.ShapeDtypeStruct`` s), reading no data."""
    kinds = read_manifest(path)["leaves"]
    saved = _saved_tree(os.path.abspath(path), STATE_ITEM, private)

    def shape(meta: Any) -> jax.ShapeDtypeStruct:
        kind = kinds[meta.name]
        if kind["kind"] in HOST_LOCAL_KINDS:
            return jax.ShapeDtypeStruct(tuple(kind["shape"]), hostlocal.dtype_of(kind))
        return jax.ShapeDtypeStruct(tuple(meta.shape), meta.dtype)

    return jax.tree.map(shape, saved)
