"""Restore a checkpoint, or some of its leaves, without the model code."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CorruptCheckpointError
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import files, host_budget, keypaths, manifest, run_identity, storage
from jaxjob._src.checkpoint import targets as targets_lib
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.io import CheckpointIO
from jaxjob._src.checkpoint.layout import (
    check_epoch,
    committed_epochs,
    db_name,
    is_committed,
    parse_name,
)
from jaxjob._src.core.workspace import Workspace, check_names

__all__ = ["checkpoint_dirs", "restore"]

logger = get_logger(__name__)
_RETRIES = 3  # listings of the latest epoch before a restore racing retention gives up


def _nodes_under(db_prefix: str) -> list[str]:
    entries = fs.listdir(db_prefix)
    if not entries:
        raise FileNotFoundError(f"no checkpoint directory or db_prefix at {db_prefix!r}")
    return sorted({p.node for e in entries if (p := parse_name(e)) and not p.tmp})


def checkpoint_dirs(path: str | os.PathLike, epoch: int | None, node_name: str | None) -> list[str]:
    """The checkpoint directories to read: ``path`` itself, or one per node under a db_prefix.

    Under a db_prefix: ``epoch``, by default the latest committed for every
    node, of ``node_name``, by default every node.

    Raises:
        FileNotFoundError: If there is no such committed checkpoint (listing
            the committed epochs).
        ValueError: If ``epoch`` or ``node_name`` is given with one checkpoint directory.
    """
    path = fs.normalize(path, "path")
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
    target: Mapping[str, Any] | None = None,
    sharding: Any = None,
    host_map: HostMap | None = None,
    max_host_bytes: int | None = None,
) -> Workspace:
    """Restores a committed checkpoint, or some of its leaves, without the model code.

    Only the bytes of the requested leaves are read. In a multi-process job,
    call it on every process, except for a checkpoint that one process wrote
    alone (``owner_process``), which any process reads on its own. Without a
    target, containers come back as the checkpoint stores them (dicts, lists,
    tuples, None); leaves keep their saved types (``jax.Array``, typed PRNG
    keys, bfloat16, NumPy arrays and scalars, Python scalars).

    Args:
        path: One checkpoint directory (``<db_prefix>/<node>.<epoch>``, also a
            copy elsewhere), or a ``db_prefix``; local, ``gs://`` or ``s3://``.
        epoch: With a db_prefix: this epoch instead of the latest one
            committed for every node.
        node_name: With a db_prefix: only this node's checkpoint (default: all nodes).
        leaves: What to restore (default: every name, or the target's keys).
            Each entry is a name, which comes back under that name, or a
            ``/``-joined key path into one (dict keys and sequence indices:
            ``"params/layers/3/w"``), which comes back under that path string
            holding the subtree there. ``*`` matches within one segment,
            ``**`` any number of segments: ``"model/layers/1*/w"`` gives
            ``model/layers/1/w``, ``model/layers/10/w``, ... A pattern selects
            the outermost subtrees it matches.
        target: Key (as in the result) -> pytree of ``jax.ShapeDtypeStruct``
            or arrays, e.g. from ``jax.eval_shape``, ``nnx.eval_shape`` or
            ``eqx.filter_eval_shape``. That key comes back with exactly the
            target's pytree types (NamedTuples, ``nnx.State`` and its
            Variables, equinox modules), dtypes and, where its leaves carry
            them, shardings. Leaves are matched by key path; a target leaf
            that is not an array and that the checkpoint lacks (an activation
            function) is passed through. An ``nnx.State`` may hold fewer
            Variable types than the checkpoint (``nnx.state(model,
            nnx.Param)``): only its own are read; one missing a Variable of
            a type it holds (a dropped layer) is a structure mismatch.
        sharding: Where ``jax.Array`` leaves go (where the target gives no
            sharding): a ``jax.sharding.Sharding``, or a mapping from a key or
            name to a Sharding or to a pytree of them, which may be a prefix
            of that entry's structure (None inside it: the default). Default:
            JAX's default device (``jax.default_device``), whatever device
            count saved them.
        host_map: For host-local leaves (NumPy arrays, scalars) saved by
            another number of processes: for each process here, the saved
            process whose copy it gets (a callable or a sequence). With the
            same process count each process gets its own copy.
        max_host_bytes: A host-memory budget: the leaves are read in groups
            of at most this many bytes, one group after the other, so that
            the restore's peak resident memory stays within the restored
            workspace plus this budget (a leaf larger than it is read
            alone). Default: every leaf at once, the fastest.

    Returns:
        A workspace of the restored keys.

    Raises:
        FileNotFoundError: If there is no such checkpoint (lists committed
            epochs), or ``epoch``'s was deleted while it was read (a live
            run's retention); with ``epoch=None`` the newest committed one is
            read instead.
        CorruptCheckpointError: If a checkpoint read is damaged or its
            manifest malformed, or names another node or epoch than its
            directory, or another run than its db_prefix's saved it (read
            through the db_prefix, or as a directory inside one).
        KeyError: If a pattern of ``leaves`` matches nothing (lists close key
            paths), or a key of a ``sharding`` mapping names neither a
            restored key nor a saved name (lists the available ones), or a
            key path inside its pytree matches nothing saved, at any depth
            (names it and lists the keys at the deepest level it reaches).
        ValueError: If a target differs from the checkpoint in structure, a
            shape or a dtype (naming the key path, both values, the epoch and
            the directory), or host-local leaves were saved by another number
            of processes and ``host_map`` is None, or ``max_host_bytes`` is
            not None nor a positive int.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp
        >>> import jaxjob
        >>> prefix = tempfile.mkdtemp()
        >>> ckpt = jaxjob.CheckpointManager(prefix)
        >>> layers = [{"w": jnp.full(2, i)} for i in range(12)]
        >>> ckpt.save(0, {"params": {"layers": layers}, "opt": jnp.zeros(2)})
        >>> ckpt.wait_until_finished()
        >>> jaxjob.restore(prefix, leaves=["params"])["params"]["layers"][3]["w"].tolist()
        [3, 3]
        >>> sorted(jaxjob.restore(prefix, leaves=["params/layers/1*/w"]))
        ['params/layers/1/w', 'params/layers/10/w', 'params/layers/11/w']
        >>> like = {"opt": jax.ShapeDtypeStruct((2,), jnp.float32)}
        >>> jaxjob.restore(prefix, target=like)["opt"].tolist()
        [0.0, 0.0]
    """
    epoch = None if epoch is None else check_epoch(epoch)
    if isinstance(leaves, str):
        raise TypeError(f"leaves must be a list of names or key paths, got the string {leaves!r}")
    if target is not None and not isinstance(target, Mapping):
        raise TypeError(f"target must be a mapping from key to pytree, got {type(target).__name__}")
    leaves = None if leaves is None else list(leaves)  # read twice if a retry reads again
    check_names(leaves or (), "leaves")
    check_names(target or {}, "target")
    budget = host_budget.check_budget(max_host_bytes)
    dirs = checkpoint_dirs(path, epoch, node_name)
    request = _Request(
        fs.normalize(path, "path"), epoch, node_name, leaves, target, sharding, host_map, budget
    )
    return _restore_listed(request, dirs)


@dataclasses.dataclass(frozen=True)
class _Request:
    """What :func:`restore` was asked for (``path`` normalized)."""

    path: str
    epoch: int | None
    node_name: str | None
    leaves: Iterable[str] | None
    target: Mapping[str, Any] | None
    sharding: Any
    host_map: HostMap | None
    max_host_bytes: int | None = None


def _restore_listed(request: _Request, dirs: list[str], retries: int = _RETRIES) -> Workspace:
    """Reads ``dirs`` (as listed for ``request``); a checkpoint deleted meanwhile is not damage.

    If a directory stopped being committed while it was read (a live run's
    retention deleted it), the latest is listed and read again when the
    latest was asked for; else the missing epoch is named.

    Raises:
        FileNotFoundError: If the requested epoch was deleted during the restore.
    """
    try:
        return _read(request, dirs)
    except fs.StorageTimeoutError:
        raise  # a silent store: listing it again would wait again
    except (CorruptCheckpointError, OSError) as err:
        gone = [d for d in dirs if not is_committed(d)]
        if not gone:
            raise
        single = dirs == [request.path]
        if request.epoch is not None or single or retries == 0:
            raise FileNotFoundError(
                f"the checkpoint {gone} was deleted while it was being restored (e.g. by a "
                f"live run's retention), it is not damaged; "
                + ("" if single else f"committed epochs now: {_committed_now(request)}; ")
                + "restore a committed epoch"
            ) from err
        logger.info("%s was deleted while it was being restored: restoring the latest", gone)
        return _restore_listed(
            request, checkpoint_dirs(request.path, None, request.node_name), retries - 1
        )


def _committed_now(request: _Request) -> list[int]:
    nodes = [request.node_name] if request.node_name else _nodes_under(request.path)
    epochs = [set(committed_epochs(request.path, n)) for n in nodes]
    return sorted(set.intersection(*epochs)) if epochs else []


def _read(request: _Request, dirs: list[str]) -> Workspace:
    path, target, leaves = request.path, request.target, request.leaves
    # read through a db_prefix, or a directory inside one: each must be the prefix's run's
    prefix = run_identity.holding_prefix(path) if dirs == [path] else path
    checked = {d: files.read_checked(d, db_prefix=prefix) for d in dirs}
    manifests = {d: found for d, (found, _) in checked.items()}
    state = {k: v for m in manifests.values() for k, v in m.state.items()}
    patterns = list(leaves) if leaves is not None else (list(target) if target else None)
    chosen = keypaths.select(state, patterns, where=f" in the checkpoint at {str(path)!r}")
    unused = [k for k in target or {} if k not in chosen]
    if unused:
        raise ValueError(
            f"target keys {unused} are not restored; restored keys: {list(chosen)} "
            "(a target key must be a name or key path that leaves= selects)"
        )
    _check_sharding_keys(request.sharding, chosen, state)
    result: dict[str, Any] = {}
    for d, found in manifests.items():
        mine = {k: sel for k, sel in chosen.items() if sel.name in found.state}
        result.update(_restore_one(d, found, mine, request))
        whole = {sel.name for sel in mine.values()} == set(found.state) and not any(
            sel.segments for sel in mine.values()
        )
        files.unread(d, found.epoch, checked[d][1], whole=whole)
    return Workspace({k: result[k] for k in chosen})


def _check_sharding_keys(
    sharding: Any, chosen: Mapping[str, keypaths.Selection], state: Mapping[str, Any]
) -> None:
    """Raises if a key of a ``sharding=`` mapping, or a key path in its pytrees, matches nothing.

    Raises:
        KeyError: Listing the unmatched keys and the restored keys and names.
    """
    if not isinstance(sharding, Mapping):
        return
    known = set(chosen) | {sel.name for sel in chosen.values()} | set(state)
    unmatched = [k for k in sharding if k not in known]
    if unmatched:
        available = sorted(set(chosen) | set(state))
        raise KeyError(
            f"sharding keys {unmatched} match no restored key and no name in the checkpoint; "
            f"available: {available} (a key of sharding= is a name or a key path of leaves=)"
        )
    targets_lib.check_sharding_paths(sharding, chosen, state)


def _restore_one(path: str, found: Any, chosen: Any, request: _Request) -> dict[str, Any]:
    if not chosen:
        return {}
    with CheckpointIO(path, storage.stored_codec(found)) as reader:
        return storage.restore_selected(
            reader,
            path,
            found,
            chosen,
            targets=request.target,
            sharding=request.sharding,
            host_map=request.host_map,
            filtered_states=True,
            max_host_bytes=request.max_host_bytes,
        )
