"""Tree structures: pytrees as the manifest's JSON and back, their leaves by stored name.

The structure keeps what a restore without model code needs to rebuild the
tree exactly: dict keys with their types (``int``, ``bool`` and ``str``),
lists vs tuples, ``None`` and leaf order. NamedTuples and other custom pytree
nodes are kept in their dict (attribute names) or list form;
``restore(target=...)`` gives them back their own types. The manifest keeps
one structure per persistent name (its ``state``) and per saved output (its
``outputs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.checkpoint import stored_names
from jaxjob._src.checkpoint.leaf_spec import UnstorableLeafError, leaf_key

__all__ = ["flatten", "is_nnx_variable", "signature", "unflatten"]

_PLAIN_KEYS = (str, int, bool)  # dict keys that their type and value describe


def _key(key: Any) -> Any:
    """A JSON form of a dict key: a string, or ``{"int": n}`` / ``{"bool": b}``."""
    if isinstance(key, bool):
        return {"bool": key}
    if isinstance(key, int | np.integer):
        return {"int": int(key)}
    return str(key)


def _unkey(key: Any) -> Any:
    if isinstance(key, dict):
        return bool(key["bool"]) if "bool" in key else int(key["int"])
    return key


def _pytree_children(tree: Any) -> list[tuple[Any, Any]]:
    """One level of a pytree node, in JAX's order: ``(key entry, child)`` pairs."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    return [(path[0], child) for path, child in flat]


def _is_leaf(tree: Any) -> bool:
    treedef = jax.tree_util.tree_structure(tree)
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _entry_key(entry: Any) -> Any:
    for attr in ("key", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return None


def is_nnx_variable(node: Any) -> bool:
    """Whether ``node`` is an ``nnx.Variable`` (``nnx.Param``...; flax is not imported)."""
    return any(
        k.__name__ == "Variable" and k.__module__.startswith("flax.nnx") for k in type(node).__mro__
    )


def flatten(
    tree: Any, where: str, namer: stored_names.Namer, segments: tuple[str, ...] = ()
) -> tuple[Any, list[tuple[str, Any, str]]]:
    """The JSON structure of ``tree`` and its leaves as ``(stored name, leaf, key path)``.

    Leaves are in JAX's flattening order; ``namer`` names each by its key path:
    ``segments`` (the persistent name's parts), then the keys down to it. An
    ``nnx.Variable`` 's node also records its type's name (``"variable":
    "Param"``), by which a filtered ``nnx.State`` target is told from one
    that lacks Variables (:mod:`jaxjob._src.checkpoint.targets`).
    """
    leaves: list[tuple[str, Any, str]] = []

    def walk(node: Any, path: str, parts: tuple[Any, ...]) -> Any:
        if node is None:
            return {"none": True}
        if _is_leaf(node):
            name = namer.name(parts)
            leaves.append((name, node, path))
            return {"leaf": name}
        children = _pytree_children(node)
        keyless = bool(children) and all(_entry_key(e) is None for e, _ in children)
        if type(node) in (list, tuple) or (type(node) is not dict and keyless):
            kind = "tuple" if type(node) is tuple else "list"
            return {
                kind: [
                    walk(c, f"{path}{jax.tree_util.keystr((e,))}", (*parts, i))
                    for i, (e, c) in enumerate(children)
                ]
            }
        keys = [_key(_entry_key(e)) for e, _ in children]
        _check_unique(keys, path)
        found: dict[str, Any] = {
            "dict": [
                [key, walk(c, f"{path}{jax.tree_util.keystr((e,))}", (*parts, _entry_key(e)))]
                for key, (e, c) in zip(keys, children, strict=True)
            ]
        }
        if is_nnx_variable(node):
            found["variable"] = type(node).__name__
        return found

    return walk(tree, where, segments), leaves


def signature(tree: Any, key: list[Any], leaves: list[Any]) -> bool:
    """Appends to ``key`` what :func:`flatten` reads of ``tree``, and its leaves to ``leaves``.

    Trees that append equal keys flatten to the same structure and stored names,
    and their leaves to the same :class:`~jaxjob._src.checkpoint.leaf_spec.LeafSpec` s
    (:func:`~jaxjob._src.checkpoint.leaf_spec.leaf_key`), in the order ``leaves``
    has them. Each node appends its kind and keys: a ``dict`` 's ``str``, ``int``
    or ``bool`` keys with their types, a list's or tuple's length, and any other
    node's type and, for each child, the key path part, JSON key and name part
    that :func:`flatten` derives from its key.

    Returns:
        False, having stopped, at a leaf that no checkpoint stores or at a dict
        whose keys do not sort (:func:`flatten` raises for both).
    """
    if tree is None:
        key.append(None)
        return True
    kind = type(tree)
    if kind is dict and all(type(k) in _PLAIN_KEYS for k in tree):
        try:
            order = sorted(tree)  # JAX's order
        except TypeError:
            return False
        key.append(("dict", *[k if type(k) is str else (type(k), k) for k in order]))
        return all(signature(tree[k], key, leaves) for k in order)
    if kind is list or kind is tuple:
        key.append((kind.__name__, len(tree)))
        return all(signature(child, key, leaves) for child in tree)
    if _is_leaf(tree):
        leaves.append(tree)
        key.append(leaf_key(tree))
        return key[-1] is not None
    children = _pytree_children(tree)
    key.append(("node", kind, *[_entry_signature(e) for e, _ in children]))
    return all(signature(child, key, leaves) for _, child in children)


def _entry_signature(entry: Any) -> tuple[str, bool, str, str]:
    """What :func:`flatten` derives from a custom node's key entry: path, None, JSON key, name."""
    key = _entry_key(entry)
    return jax.tree_util.keystr((entry,)), key is None, repr(_key(key)), str(key)


def _check_unique(keys: list[Any], path: str) -> None:
    """Refuses dict keys that are one key once stored (``1.5`` and ``"1.5"``: both ``"1.5"``).

    Raises:
        UnstorableLeafError: Naming the container's key path and the keys.
    """
    stored = [_unkey(k) for k in keys]
    if len(set(stored)) < len(stored):
        twice = sorted({str(k) for k in stored if stored.count(k) > 1})
        raise UnstorableLeafError(
            f"cannot checkpoint the container at {path or 'the top'}: its keys {twice} are "
            "the same once stored (a checkpoint keeps str, int and bool keys; others become "
            "their str); rename them"
        )


def unflatten(structure: Any, leaves: Mapping[str, Any]) -> Any:
    """Rebuilds a tree from its JSON structure and its leaves by stored name."""
    if "leaf" in structure:
        return leaves[structure["leaf"]]
    if "none" in structure:
        return None
    if "dict" in structure:
        return {_unkey(k): unflatten(v, leaves) for k, v in structure["dict"]}
    if "tuple" in structure:
        return tuple(unflatten(v, leaves) for v in structure["tuple"])
    return [unflatten(v, leaves) for v in structure["list"]]
