"""Shardings after a resume: the state as the epoch group leaves it, traced without running it.

After epoch ``k >= 1`` the state has the shardings of the epoch group's
outputs, which may differ from those init gave it. Tracing the epoch group
from init's (until the shardings stop changing) gives them without running
anything; the next epoch's compilation is the same one. What host steps set
keeps the shardings it has (they cannot be traced).

A jitted task that reads what a host task of the epoch group returns (a data
loader's batch) cannot be traced before the load: the host task's outputs are
epoch outputs, not in the checkpoint, and it needs the restored values (a
cursor) to run. Such a job restores with init's shardings and the epoch group
is traced in the first epoch, right before the first jitted program, with what
the host tasks returned in that epoch's own run (:func:`run_epoch_group`): the
host task runs once, as in an uninterrupted run, and its outputs are the ones
that epoch's programs compile with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import keypaths
from jaxjob._src.core.session import Program, Session
from jaxjob._src.core.task import TaskGroup
from jaxjob._src.core.workspace import Workspace

__all__ = [
    "as_saved",
    "epoch_shardings",
    "movable",
    "moved",
    "run_epoch_group",
    "traced_shardings",
]

logger = get_logger(__name__)


def epoch_shardings(
    session: Session,
    group: TaskGroup,
    epoch: int,
    abstract: dict[str, Any],
    targets: dict[str, Any],
) -> tuple[dict[str, Any], bool]:
    """The restore targets with the shardings the epochs leave, and whether tracing must wait.

    Args:
        session: The session resuming.
        group: The epoch group.
        epoch: The epoch resumed from (epoch 0 keeps init's shardings).
        abstract: Every name the init group sets, abstractly.
        targets: The restore targets, with init's shardings.

    Returns:
        ``(targets, deferred)``: ``deferred`` when the epoch group reads host
        task outputs, so that its shardings are traced in its next run
        (:func:`run_epoch_group`) and ``targets`` keep init's.
    """
    if epoch == 0:
        return targets, False
    traced = traced_shardings(session.steps(group), abstract, targets)
    if traced is None:
        logger.debug(
            "The epoch group reads host task outputs: its shardings are traced in its next run"
        )
        return targets, True
    return traced, False


def run_epoch_group(
    session: Session, group: TaskGroup, *, deferred: bool, traced_names: set[str]
) -> Workspace:
    """Runs the epoch group; with ``deferred`` shardings, reshards the state first.

    Its host tasks must keep the types of the traced persistent leaves
    (``Session.run``'s ``keep_traced``): what they return is saved.

    With ``deferred`` (a host task feeding the epoch group's jitted tasks,
    :func:`epoch_shardings`), before the first jitted program whose inputs
    are all known, the epoch group is traced on the epoch's workspace (the
    host outputs included) until the shardings stop changing, and the state
    leaves among ``traced_names`` not yet rewritten in this epoch are moved to
    the traced shardings (a copy, bitwise; on one device nothing moves), as
    the previous epoch would have left them.
    """
    if not deferred:
        return session.run(group, keep_traced=True)
    start = session.workspace
    names = [n for n in start if n in traced_names]
    steps = session.steps(group)
    pending = [True]

    def reshard(ws: Workspace) -> Workspace:
        if not pending[0]:
            return ws
        abstract = {k: v for k, v in ws.items() if k not in start}
        traced = traced_shardings(steps, {**start, **abstract}, {n: start[n] for n in names})
        if traced is None:
            return ws  # a later host step's outputs are missing: try at the next program
        pending[0] = False
        kept = [n for n in names if ws[n] is start[n]]
        return ws.set({n: jax.tree.map(moved, ws[n], traced[n]) for n in kept})

    return session.run(group, before_program=reshard, keep_traced=True)


def _shardings(tree: Any) -> list[Any]:
    return [getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(tree)]


def traced_shardings(
    steps: Sequence[Any], abstract: dict[str, Any], targets: dict[str, Any]
) -> dict[str, Any] | None:
    """``targets`` with the shardings the jitted ``steps`` leave them at their fixed point.

    Returns:
        None if a jitted step reads a name that ``abstract`` lacks and a host
        step of ``steps`` (whose outputs cannot be traced) may set.

    Raises:
        KeyError: If a jitted step reads a missing name and no host step precedes it.
    """
    programs = [s for s in steps if isinstance(s, Program)]
    if not programs:
        return targets
    for _ in range(3):  # a fixed point is reached after one epoch in practice
        ws = {**abstract, **targets}
        host_before = False
        for step in steps:
            if not isinstance(step, Program):
                host_before = True
                continue
            try:
                ws.update(step.abstract(ws))
            except KeyError:
                if host_before:
                    return None
                raise
        traced = {k: ws[k] for k in targets if k in ws}
        if _shardings(traced) == _shardings({k: targets[k] for k in traced}):
            break
        targets = {**targets, **traced}
    return targets


def moved(leaf: Any, target: Any) -> Any:
    """``leaf`` on ``target`` 's sharding (the same array if it is there already)."""
    sharding = getattr(target, "sharding", None)
    if not isinstance(leaf, jax.Array) or sharding is None or leaf.sharding == sharding:
        return leaf
    return jax.device_put(leaf, sharding)


def as_saved(manager: Any, epoch: int, targets: dict[str, Any]) -> dict[str, Any]:
    """Restore targets, with their saved shardings, for the saved names ``targets`` lacks.

    The names that no jitted init task sets (a host task's: it is never
    called on resume) have no traced target. Without one they would land on
    the default device; on the devices that saved the checkpoint each of
    their ``jax.Array`` leaves (a 0-d one too) is restored with the sharding
    it was saved with instead, and the tree comes back as saved (dicts,
    lists, tuples, None). On other devices there is none to give: empty.

    Args:
        manager: The tier's reader restoring (``saved_shapes`` and ``saved_targets``).
        epoch: The epoch restored.
        targets: The traced targets (those names are left out).
    """
    placed = manager.saved_targets(epoch)
    if placed is None:
        return {}
    found = {}
    for name, tree in manager.saved_shapes(epoch).items():
        if name not in targets:
            flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
            leaves = [_placed(placed, name, path, leaf) for path, leaf in flat]
            found[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    return found


def _placed(placed: dict[tuple[str, ...], Any], name: str, path: tuple, leaf: Any) -> Any:
    """The saved leaf with its saved sharding; host-local leaves (not in ``placed``) as they are."""
    return placed.get((name, *keypaths.entry_segments(path)), leaf)


def movable(ws: Workspace) -> Workspace:
    """``ws`` restored, with its arrays on this process's first device alone made uncommitted.

    A jitted init task's output that no sharding pins (a counter, a PRNG key)
    is an uncommitted array on the default device: a program may combine it
    with arrays on a mesh, and JAX moves it there. Restored, it would be
    committed to that device, and the same program, resumed from an epoch
    whose state still holds it (epoch 0), would fail with "incompatible
    devices". On a single device, where a mesh holds that one device, the
    program runs either way but gives what it computes from such an array
    (a step counter plus one) the committed array's sharding type
    (``SingleDeviceSharding``) instead of the mesh's: uncommitted, the
    outputs are bitwise what an uninterrupted run's are, shardings included.
    On a single device with no array on a mesh nothing changes: it is
    returned as it is.
    """
    on_mesh = any(
        isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
        for x in jax.tree.leaves(dict(ws))
    )
    if jax.device_count() == 1 and not on_mesh:
        return ws
    first = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def uncommitted(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.sharding != first:
            return leaf
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(leaf))
            return jax.random.wrap_key_data(jax.device_put(data), impl=jax.random.key_impl(leaf))
        return jax.device_put(np.asarray(leaf))

    return Workspace(jax.tree.map(uncommitted, dict(ws)))
