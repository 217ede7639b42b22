"""Restore plans: how each stored leaf of a selected subtree is read, and the tree rebuilt.

Without a target, a subtree comes back as the checkpoint stores it (dicts,
lists, tuples, None). With a target (a pytree of ``jax.ShapeDtypeStruct`` s
or arrays, e.g. from ``jax.eval_shape``, ``nnx.eval_shape`` or
``eqx.filter_eval_shape``), it comes back with the target's exact pytree
types: target leaves are matched to stored leaves by key path (dict keys,
attribute names and sequence indices, whatever the container type), each
checked for shape and dtype. A target leaf that is not an array (an equinox
module's activation function) and that the checkpoint does not hold is passed
through unchanged. An ``nnx.Variable`` 's ``value`` matches a stored plain
leaf (a state saved with ``nnx.to_pure_dict``). In ``jaxjob.restore`` (not
in a job's resume, whose targets are its init's), an ``nnx.State`` in the
target may hold fewer Variable types than the checkpoint
(``nnx.state(model, nnx.Param)`` of a model saved with its RNG state): the
Variables of the other types are not read (a save records each Variable's
type). A Variable of a type the State holds, missing from it (a dropped
layer's Param), is a structure mismatch, as anywhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import jax_private
from jaxjob._src.checkpoint import keypaths
from jaxjob._src.checkpoint.leaf_spec import LeafSpec
from jaxjob._src.checkpoint.tree import is_nnx_variable, unflatten

__all__ = ["Plan", "ShardingRule", "check_sharding_paths", "plan"]


def _is_value_attr(path: tuple) -> bool:
    return bool(path) and getattr(path[-1], "name", None) == "value"


def _is_sharding(x: Any) -> bool:
    return x is None or isinstance(x, jax.sharding.Sharding)


def _default_device_sharding() -> jax.sharding.Sharding:
    device = jax.config.jax_default_device
    if not isinstance(device, jax.Device):
        device = jax.local_devices()[0]
    return jax.sharding.SingleDeviceSharding(device)


@dataclasses.dataclass(frozen=True)
class ShardingRule:
    """Where the ``jax.Array`` leaves of one selection go, by key path under its name.

    Attributes:
        entries: ``(segments under the name, sharding)``; the longest prefix
            of a leaf's key path wins; None: JAX's default device.
    """

    entries: tuple[tuple[tuple[str, ...], jax.sharding.Sharding | None], ...]

    @classmethod
    def of(cls, sharding: Any, key: str, name: str, segments: tuple[str, ...]) -> ShardingRule:
        """The rule of the selection ``key`` (``name`` at ``segments``) from ``sharding=``.

        Raises:
            TypeError: If a sharding given is not a ``jax.sharding.Sharding``.
        """
        base: tuple[str, ...] = ()
        if isinstance(sharding, Mapping):
            if key in sharding:
                sharding, base = sharding[key], segments
            else:
                sharding = sharding.get(name)
        flat = jax.tree_util.tree_flatten_with_path(sharding, is_leaf=_is_sharding)[0]
        entries = []
        for path, leaf in flat:
            if not _is_sharding(leaf):
                where = f"[{key!r}]{jax.tree_util.keystr(path)}"
                raise TypeError(
                    f"sharding at {where} must be a jax.sharding.Sharding (or None for the "
                    f"default device), got {type(leaf).__name__}"
                )
            entries.append(((*base, *keypaths.entry_segments(path)), leaf))
        return cls(tuple(entries) or (((), None),))

    def get(self, segments: tuple[str, ...]) -> jax.sharding.Sharding:
        """The sharding of the leaf at ``segments`` under the name."""
        best, found = -1, None
        for prefix, sharding in self.entries:
            if len(prefix) > best and segments[: len(prefix)] == prefix:
                best, found = len(prefix), sharding
        return found or _default_device_sharding()


def check_sharding_paths(
    sharding: Any, chosen: Mapping[str, keypaths.Selection], state: Mapping[str, Any]
) -> None:
    """Raises if a key path of a ``sharding=`` mapping's pytrees matches no saved node.

    A key of the mapping is a restored key (its pytree is under that
    selection) or a saved name; its pytree's key paths must lead to nodes the
    checkpoint holds under it (a prefix is a subtree's sharding). Keys that
    match neither are left to the caller.

    Raises:
        KeyError: Naming the first key path that matches nothing and the keys
            at the deepest level it reaches.
    """
    if not isinstance(sharding, Mapping):
        return
    for key, tree in sharding.items():
        if key in chosen:
            name, base = chosen[key].name, chosen[key].segments
        elif key in state:
            name, base = key, ()
        else:
            continue
        present = {segs for segs, _ in keypaths.nodes(state[name])}
        for path, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_sharding)[0]:
            segments = (*base, *keypaths.entry_segments(path))
            if segments not in present:
                raise _unmatched(key, path, segments, present, name)


def _unmatched(key: Any, path: tuple, segments: tuple, present: set, name: str) -> KeyError:
    depth = max(i for i in range(len(segments)) if segments[:i] in present)
    level = segments[:depth]
    there = sorted(s[-1] for s in present if len(s) == depth + 1 and s[:depth] == level)
    at = f"[{name!r}]" + "".join(f"[{s!r}]" for s in level)
    return KeyError(
        f"sharding= key path [{key!r}]{jax.tree_util.keystr(path)} matches nothing in the "
        f"checkpoint; the keys at {at} are {there}{' (a leaf)' if not there else ''}: a "
        "sharding pytree may be a prefix of the saved tree, with its keys"
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one selection is read.

    Attributes:
        abstracts: Stored name -> ``jax.ShapeDtypeStruct`` (shape, dtype and
            sharding to restore the leaf with).
        build: Rebuilds the subtree from the restored leaves by stored name.
    """

    abstracts: dict[str, jax.ShapeDtypeStruct]
    build: Callable[[Mapping[str, Any]], Any]


def plan(
    selection: keypaths.Selection,
    specs: Mapping[str, LeafSpec],
    rule: ShardingRule,
    *,
    target: Any = None,
    has_target: bool = False,
    where: str = "",
    subset: bool = False,
) -> Plan:
    """The plan of one selection: as saved, or like ``target`` when ``has_target``.

    With ``subset`` (``jaxjob.restore`` 's targets, never a job's resume), an
    ``nnx.State`` of the target filtered by Variable type reads only its own
    Variables; else every stored leaf must be in the target.

    Raises:
        ValueError: If the target's structure, a shape or a dtype differs
            from the checkpoint (naming the key path and ``where``).
    """
    stored = keypaths.leaf_names(selection.structure, selection.segments)
    if has_target:
        return _target_plan(selection, stored, specs, rule, target, where, subset)
    abstracts = {
        name: _abstract(specs[name].abstract(), rule.get(segs), specs[name])
        for segs, name in stored
    }
    return Plan(abstracts, lambda leaves: unflatten(selection.structure, leaves))


def _abstract(leaf: Any, sharding: jax.sharding.Sharding, spec: LeafSpec) -> jax.ShapeDtypeStruct:
    try:
        if sharding is not None:
            jax_private.check_sharding(sharding, np.shape(leaf))  # as JAX 0.8.2+ does below
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)
    except ValueError as err:
        raise ValueError(f"sharding of {spec.path} (shape {spec.shape}): {err}") from None


def _is_array_like(leaf: Any) -> bool:
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


def _match(selection: keypaths.Selection, stored: list[tuple], flat: list[tuple]) -> tuple:
    """The stored leaf of each target leaf (None: passed through), and target leaves lacking one."""
    by_segments = {segs: name for segs, name in stored}
    slots: list[tuple[tuple[str, ...], str | None]] = []
    lacking = []
    for path, leaf in flat:
        segs = (*selection.segments, *keypaths.entry_segments(path))
        if segs not in by_segments and _is_value_attr(path):
            segs = segs[:-1]
        slots.append((segs, by_segments.get(segs)))
        if slots[-1][1] is None and _is_array_like(leaf):
            lacking.append(_where(selection) + jax.tree_util.keystr(path))
    return slots, lacking


def _is_nnx_state(node: Any) -> bool:
    """Whether ``node`` is an ``nnx.State`` (flax is not imported for it)."""
    kind = type(node)
    return kind.__name__ == "State" and kind.__module__.startswith("flax.nnx")


def _filtered(selection: keypaths.Selection, target: Any) -> list[tuple[tuple[str, ...], set]]:
    """Each ``nnx.State`` of the target: its key path and the Variable types it holds."""
    states = jax.tree_util.tree_flatten_with_path(target, is_leaf=_is_nnx_state)[0]
    found = []
    for path, node in states:
        if _is_nnx_state(node):
            held = jax.tree_util.tree_leaves(node, is_leaf=is_nnx_variable)
            kinds = {type(v).__name__ for v in held if is_nnx_variable(v)}
            found.append(((*selection.segments, *keypaths.entry_segments(path)), kinds))
    return found


def _variable_types(selection: keypaths.Selection) -> dict[tuple[str, ...], str]:
    """The key paths of the stored ``nnx.Variable`` nodes, and their types' names."""
    nodes = keypaths.nodes(selection.structure, selection.segments)
    return {segs: node["variable"] for segs, node in nodes if "variable" in node}


def _left_out(selection, stored, matched, target) -> list[tuple[str, ...]]:
    """Stored leaves a filtered ``nnx.State`` of the target leaves out (they are not read).

    A stored leaf is left out when it is a Variable under the key path of an
    ``nnx.State`` of the target, of a type that State holds none of: the
    State was filtered by type (``nnx.state(model, nnx.Param)``). A
    Variable of a type it holds (a Param of a dropped layer) is not.
    """
    states = _filtered(selection, target)
    kinds = _variable_types(selection)
    out = []
    for segs, name in stored:
        kind = next((kinds[segs[:i]] for i in range(len(segs), 0, -1) if segs[:i] in kinds), None)
        if name in matched or kind is None:
            continue
        if any(segs[: len(f)] == f and kind not in held for f, held in states):
            out.append(segs)
    return out


def _target_plan(selection, stored, specs, rule, target, where, subset) -> Plan:
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    slots, lacking = _match(selection, stored, flat)
    matched = {name for _, name in slots if name is not None}
    left_out = set(_left_out(selection, stored, matched, target)) if subset else set()
    extra = [specs[n].path for segs, n in stored if n not in matched and segs not in left_out]
    if lacking or extra:
        raise ValueError(
            f"structure mismatch for {selection.key!r} in {where}: the target has leaves the "
            f"checkpoint lacks {lacking} and the checkpoint has leaves the target lacks {extra}"
        )
    abstracts: dict[str, jax.ShapeDtypeStruct] = {}
    for (segs, name), (_, leaf) in zip(slots, flat, strict=True):
        if name is not None:
            _check_leaf(leaf, specs[name], where)
            sharding = getattr(leaf, "sharding", None) or rule.get(segs)
            abstracts[name] = _abstract(specs[name].abstract(), sharding, specs[name])

    def build(leaves: Mapping[str, Any]) -> Any:
        pairs = zip(slots, flat, strict=True)
        values = [leaf if n is None else leaves[n] for (_, n), (_, leaf) in pairs]
        return jax.tree_util.tree_unflatten(treedef, values)

    return Plan(abstracts, build)


def _where(selection: keypaths.Selection) -> str:
    return f"[{selection.name!r}]" + "".join(f"[{s!r}]" for s in selection.segments)


def _check_leaf(leaf: Any, spec: LeafSpec, where: str) -> None:
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
