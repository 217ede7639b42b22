"""Final workspaces compared bit for bit: a job's dumps, in-memory workspaces, runs' checkpoints."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base import fs
from jaxjob._src.checkpoint import layout, manifest
from jaxjob._src.checkpoint.restore import restore

__all__ = ["assert_bitwise_equal", "assert_checkpoints_equal", "dump_workspace"]


def _records(tree: Any) -> dict[str, Any]:
    """The tree structure, each leaf's key path and kind, and its bytes per local shard."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    found: dict[str, Any] = {"treedef": str(treedef), "paths": [], "kinds": []}
    for i, (path, leaf) in enumerate(leaves):
        found["paths"].append(jax.tree_util.keystr(path))
        dtype = getattr(leaf, "dtype", type(leaf).__name__)
        found["kinds"].append(f"{type(leaf).__name__}:{dtype}:{getattr(leaf, 'sharding', None)}")
        shards = [leaf]
        if isinstance(leaf, jax.Array):
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            shards = [s.data for s in sorted(leaf.addressable_shards, key=lambda s: s.device.id)]
        for j, shard in enumerate(shards):
            found[f"leaf{i}_shard{j}"] = np.ascontiguousarray(shard).reshape(-1).view(np.uint8)
    return found


def dump_workspace(workspace: Mapping[str, Any], directory: str) -> None:
    """Writes this process's part of ``workspace`` to ``directory/process<i>.npz``, bit for bit.

    Each process of a multi-process job writes the shards it holds, the
    tree structure and each leaf's key path, type, dtype and sharding.
    Call it at the end of a job script; compare with :func:`assert_bitwise_equal`.
    """
    found = _records(dict(workspace))
    found["paths"], found["kinds"] = np.array(found["paths"]), np.array(found["kinds"])
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, f"process{jax.process_index()}.npz"), **found)


def _load_dumps(where: Any) -> dict[str, dict[str, Any]]:
    """Each process's records: from the dumps in a directory, or of an in-memory workspace."""
    if not isinstance(where, str | os.PathLike):
        return {"process0.npz": _records(dict(where))}
    files = sorted(f for f in os.listdir(where) if f.endswith(".npz"))
    if not files:
        raise FileNotFoundError(f"no workspace dumps (process<i>.npz) in {os.fspath(where)!r}")
    found = {}
    for file in files:
        with np.load(os.path.join(where, file)) as npz:
            found[file] = {k: npz[k] for k in npz.files}
        found[file]["treedef"] = str(found[file]["treedef"])
        found[file]["paths"] = found[file]["paths"].tolist()
        found[file]["kinds"] = found[file]["kinds"].tolist()
    return found


def assert_bitwise_equal(a: Any, b: Any) -> None:
    """Asserts that two final workspaces are bitwise equal.

    Each of ``a`` and ``b`` is a directory written by :func:`dump_workspace`
    (every process's file is compared) or an in-memory workspace. Equal
    means the same tree structure, key paths, leaf types, dtypes, shardings
    and bytes (NaNs included).

    Raises:
        AssertionError: Naming the first difference.
    """
    left, right = _load_dumps(a), _load_dumps(b)
    if sorted(left) != sorted(right):
        raise AssertionError(
            f"the dumps come from other processes: {sorted(left)} vs {sorted(right)}"
        )
    for file, x in left.items():
        y = right[file]
        if x["treedef"] != y["treedef"]:
            raise AssertionError(f"the tree structures differ: {x['treedef']} vs {y['treedef']}")
        if x["paths"] != y["paths"] or len(x["kinds"]) != len(y["kinds"]):
            raise AssertionError(f"the key paths differ: {x['paths']} vs {y['paths']}")
        if x["kinds"] != y["kinds"]:
            diff = [
                f"{path}: {p} vs {q}"
                for path, p, q in zip(x["paths"], x["kinds"], y["kinds"], strict=True)
                if p != q
            ]
            raise AssertionError(f"the leaves' types, dtypes or shardings differ: {diff[:3]}")
        for name in sorted(k for k in x if k.startswith("leaf")):
            if name not in y or not np.array_equal(x[name], y[name]):
                leaf, _, shard = name[len("leaf") :].partition("_shard")
                where = x["paths"][int(leaf)]
                raise AssertionError(
                    f"the workspaces differ at {where} (shard {shard}): {x[name][:16]} vs "
                    f"{y.get(name, np.array([]))[:16]} (first bytes) in {file}"
                )


def assert_checkpoints_equal(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    epochs: Sequence[int] | None = None,
    nodes: Sequence[str] = ("local",),
) -> list[int]:
    """Asserts that two runs' checkpoints of the same epochs are bitwise equal.

    Every epoch committed under both ``a`` and ``b`` (or those of ``epochs``)
    is restored, each saved process's host-local copy in turn, onto this
    process's first device and compared with :func:`assert_bitwise_equal`.
    A killed and restarted job must write the same checkpoints as an
    uninterrupted one: this checks every resumed stretch, not only the end.
    Call it on one process.

    Returns:
        The epochs compared.

    Raises:
        AssertionError: Naming the epoch, node and first difference.
    """
    a, b = fs.normalize(a, "a"), fs.normalize(b, "b")
    common = sorted(set(layout.common_epochs(a, nodes)) & set(layout.common_epochs(b, nodes)))
    wanted = common if epochs is None else [e for e in epochs if e in common]
    for epoch in wanted:
        for node in nodes:
            path = layout.db_name(epoch, node, a)
            for row in range(manifest.read(path).process_count):
                left = restore(path, host_map=lambda p, row=row: row)
                right = restore(layout.db_name(epoch, node, b), host_map=lambda p, row=row: row)
                try:
                    assert_bitwise_equal(left, right)
                except AssertionError as err:
                    raise AssertionError(
                        f"epoch {epoch} of node {node!r} (process {row}'s copy): {err}"
                    ) from None
    return wanted
