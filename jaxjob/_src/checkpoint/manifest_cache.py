"""A save's manifest, its structure described once: one writer's saves of the same structure.

Most saves of a job save the same structure: the same names, tree structures
and, leaf by leaf, the same kind, dtype, shape and sharding. Describing it
(:func:`~jaxjob._src.checkpoint.manifest.describe`: flattening, naming each
leaf, one :class:`~jaxjob._src.checkpoint.leaf_spec.LeafSpec` per leaf) costs
~25 us a leaf on the training thread. :class:`ManifestCache` keeps the last
structure's :class:`~jaxjob._src.checkpoint.manifest.Layout` and reuses it
when a save's structure key equals the last one's; everything else in the
manifest (epoch, time, run, life, ...) and the leaves themselves are each
save's own.

The key (:func:`~jaxjob._src.checkpoint.tree.signature`) holds everything
that describing reads: the names in order, each node's kind and keys with
their types, each leaf's type, dtype, shape and sharding
(:func:`~jaxjob._src.checkpoint.leaf_spec.leaf_key`). A save with a leaf that
no checkpoint stores has no key: it is described, and refused, every time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxjob._src.checkpoint import manifest
from jaxjob._src.checkpoint.manifest import OUTPUTS, STATE
from jaxjob._src.checkpoint.tree import signature

__all__ = ["ManifestCache", "structure_key"]


def structure_key(
    state: Mapping[str, Any], outputs: Mapping[str, Any]
) -> tuple[list[Any] | None, dict[str, list[Any]]]:
    """The structure key of a save, None if it has none, and each item's leaves in order."""
    key: list[Any] = []
    leaves: dict[str, list[Any]] = {STATE: [], OUTPUTS: []}
    for item, tree in ((STATE, state), (OUTPUTS, outputs)):
        for name, value in tree.items():
            key.append((item, name))
            if not signature(value, key, leaves[item]):
                return None, leaves
    return key, leaves


class ManifestCache:
    """Describes one writer's saves, each structure once (the last one is kept).

    :meth:`describe` is :func:`~jaxjob._src.checkpoint.manifest.describe`,
    cached; the writer assembles each save's manifest from the layout
    (:func:`~jaxjob._src.checkpoint.manifest.assemble`).

    Example:
        >>> import numpy as np
        >>> cache = ManifestCache()
        >>> first, _ = cache.describe({"w": np.ones(2)}, {})
        >>> second, flat = cache.describe({"w": np.zeros(2)}, {})
        >>> second is first, flat["state"]["w"]
        (True, array([0., 0.]))
    """

    def __init__(self) -> None:
        self._key: list[Any] | None = None
        self._layout: manifest.Layout | None = None
        self._names: dict[str, list[str]] = {}

    def describe(
        self, state: Mapping[str, Any], outputs: Mapping[str, Any]
    ) -> tuple[manifest.Layout, dict[str, dict[str, Any]]]:
        """As :func:`~jaxjob._src.checkpoint.manifest.describe`, and raises as it does."""
        key, leaves = structure_key(state, outputs)
        if key is not None and key == self._key and self._layout is not None:
            flat = {
                item: dict(zip(self._names[item], leaves[item], strict=True)) for item in leaves
            }
            return self._layout, flat
        layout, flat = manifest.describe(state, outputs)
        self._remember(key, layout, flat, leaves)
        return layout, flat

    def _remember(
        self,
        key: list[Any] | None,
        layout: manifest.Layout,
        flat: dict[str, dict[str, Any]],
        leaves: dict[str, list[Any]],
    ) -> None:
        """Keeps ``layout``, for ``key`` if the key's walk met the leaves in describing's order."""
        same = all(
            len(flat[item]) == len(leaves[item])
            and all(a is b for a, b in zip(flat[item].values(), leaves[item], strict=True))
            for item in leaves
        )
        self._key = key if same else None
        self._layout = layout
        self._names = {item: list(flat[item]) for item in leaves}
