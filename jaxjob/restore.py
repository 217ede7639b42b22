"""Restore a checkpoint, or some of its leaves, without the model code."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from jaxjob import fs, manifest, orbax_adapter, storage
from jaxjob.hostlocal import HostMap
from jaxjob.layout import check_epoch, committed_epochs, db_name, is_committed
from jaxjob.workspace import Workspace

__all__ = ["restore"]

_ENTRY = re.compile(r"(.+)\.(\d+)")


def _nodes_under(db_prefix: str) -> list[str]:
    entries = fs.listdir(db_prefix)
    if not entries:
        raise FileNotFoundError(f"no checkpoint directory or db_prefix at {db_prefix!r}")
    return sorted({m.group(1) for e in entries if (m := _ENTRY.fullmatch(e))})


def _checkpoint_dirs(path: str, epoch: int | None, node_name: str | None) -> list[str]:
    """The checkpoint directories to read: ``path`` itself, or one per node under a db_prefix."""
    if fs.exists(fs.join(path, manifest.MANIFEST_ITEM)):
        if not is_committed(path):
            raise FileNotFoundError(f"{path!r} is not a committed checkpoint (no commit marker)")
        if epoch is not None or node_name is not None:
            raise ValueError(
                f"path {path!r} is one checkpoint directory; epoch= and node_name= "
                "select within a db_prefix"
            )
        return [path]
    candidates = [node_name] if node_name is not None else _nodes_under(path)
    epochs = {n: committed_epochs(path, n) for n in candidates}  # one listing per node
    nodes = candidates if node_name is not None else [n for n in candidates if epochs[n]]
    if not nodes:
        raise FileNotFoundError(f"no committed checkpoint under {path!r}")
    common = set.intersection(*(set(epochs[n]) for n in nodes))
    if epoch is None:
        if not common:
            raise FileNotFoundError(f"no epoch of nodes {nodes} is committed under {path!r}")
        epoch = max(common)
    elif epoch not in common:
        raise FileNotFoundError(
            f"epoch {epoch} is not committed for nodes {nodes} under {path!r}; "
            f"committed epochs: {sorted(common)}"
        )
    return [db_name(epoch, n, path) for n in nodes]


def restore(
    path: str | os.PathLike,
    *,
    epoch: int | None = None,
    node_name: str | None = None,
    leaves: Iterable[str] | None = None,
    sharding: Any = None,
    host_map: HostMap | None = None,
) -> Workspace:
    """Restores a committed checkpoint, or named leaves of it, with no model code.

    Only the bytes of the requested leaves are read. In a multi-process job,
    call it on every process, except for a checkpoint that one process wrote
    alone (``owner_process``), which any process reads on its own. Containers come back as
    the checkpoint stores them (dicts and lists); leaves keep their saved
    types (``jax.Array``, typed PRNG keys, bfloat16, NumPy arrays and
    scalars, Python scalars).

    Args:
        path: One checkpoint directory (``<db_prefix>/<node>.<epoch>``, also a
            copy elsewhere), or a ``db_prefix``; local, ``gs://`` or ``s3://``.
        epoch: With a db_prefix: this epoch instead of the latest one
            committed for every node.
        node_name: With a db_prefix: only this node's checkpoint (default: all nodes).
        leaves: Names to restore (default: all).
        sharding: Where ``jax.Array`` leaves go: a ``jax.sharding.Sharding``,
            or a mapping from name to Sharding. Default: this process's first
            device, whatever device count saved them.
        host_map: For host-local leaves (NumPy arrays, scalars) saved by
            another number of processes: for each process here, the saved
            process whose copy it gets (a callable or a sequence). With the
            same process count each process gets its own copy.

    Returns:
        A workspace of the restored names.

    Raises:
        FileNotFoundError: If there is no such checkpoint (lists committed epochs).
        KeyError: If a requested name is in no checkpoint (lists the available ones).
        ValueError: If host-local leaves were saved by another number of
            processes and ``host_map`` is None.

    Example:
        >>> import tempfile, jax.numpy as jnp
        >>> import jaxjob
        >>> prefix = tempfile.mkdtemp()
        >>> ckpt = jaxjob.CheckpointManager(prefix)
        >>> ckpt.save(0, {"params": {"w": jnp.ones(2)}, "opt": jnp.zeros(2)})
        >>> ckpt.wait_until_finished()
        >>> jaxjob.restore(prefix, leaves=["params"])["params"]["w"].tolist()
        [1.0, 1.0]
    """
    epoch = None if epoch is None else check_epoch(epoch)
    dirs = _checkpoint_dirs(fs.normalize(path, "path"), epoch, node_name)
    manifests = {d: manifest.read(d) for d in dirs}
    available = sorted({k for m in manifests.values() for k in m.state_keys})
    names = available if leaves is None else list(leaves)
    if isinstance(leaves, str):
        raise TypeError(f"leaves must be a list of names, got the string {leaves!r}")
    unknown = [n for n in names if n not in available]
    if unknown:
        raise KeyError(
            f"leaves {unknown} are not in the checkpoint at {path!r}; available: {available}"
        )
    result: dict[str, Any] = {}
    for d, found in manifests.items():
        mine = [n for n in names if n in found.state]
        result.update(_restore_one(d, found, mine, sharding, host_map))
    return Workspace(result)


def _restore_one(path, found, names, sharding, host_map) -> dict[str, Any]:
    private = found.owner_process is not None
    handler = storage.composite_handler(path, private)
    checkpointer = orbax_adapter.checkpointer(path, handler, private=private)
    try:
        return storage.restore(
            checkpointer, path, found, names, sharding=sharding, host_map=host_map
        )
    finally:
        checkpointer.close()
