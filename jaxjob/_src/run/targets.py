"""Resume targets: what the runner restores, traced from the init group and checked against a save.

The init group is traced abstractly (nothing runs): its jitted programs give
each name's shape and dtype, its host steps contribute the saved shapes. The
names are checked against the checkpoint's. On the devices that saved the
checkpoint each array is restored with the sharding it was saved with: the
one the saving job's next epoch read, so nothing is compiled before the first
epoch runs. On other devices (another device or process count) the init
group's programs are compiled for their shardings, and the state is given the
shardings the epochs leave from there (:mod:`jaxjob._src.run.shardings`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.extend

from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import keypaths
from jaxjob._src.core import checks
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Program, Session
from jaxjob._src.run import shardings
from jaxjob._src.run.agreement import any_process
from jaxjob._src.run.protocol import Reader

__all__ = ["loaded_nodes", "restore_targets"]

logger = get_logger(__name__)


def restore_targets(
    job: Job, session: Session, manager: Reader, epoch: int
) -> tuple[dict[str, Any], bool]:
    """The targets of the restore of ``epoch``, and whether their shardings wait for an epoch.

    Returns:
        ``(targets, deferred)`` as :func:`jaxjob._src.run.shardings.epoch_shardings` gives them.

    Raises:
        ValueError: If the checkpoint holds other names than the init group sets.
    """
    saved = manager.saved_shapes(epoch)
    as_saved = manager.saved_targets(epoch)
    found = None
    if as_saved is not None:
        meshes: list[Any] = []
        targets, _ = _init_targets(job, session, manager, epoch, saved, meshes=meshes)
        found = _with_saved_shardings(targets, as_saved, meshes)
    what = f"the restore shardings of epoch {epoch}"
    if not any_process(what, found is None, manager.timeout_s):  # every process can use them
        logger.debug("Restoring epoch %d with the shardings it was saved with", epoch)
        return found, False
    logger.debug("Epoch %d: tracing the job's shardings (devices or shardings changed)", epoch)
    targets, abstract = _init_targets(job, session, manager, epoch, saved)
    return shardings.epoch_shardings(session, job.epoch_group, epoch, abstract, targets)


def _init_targets(
    job: Job,
    session: Session,
    manager: Reader,
    epoch: int,
    saved: dict[str, Any],
    *,
    meshes: list[Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the init group's programs set, checked against the names saved at ``epoch``.

    Without ``meshes`` the programs are compiled for their output shardings;
    with it, only traced (shapes and dtypes), and the meshes their jaxprs
    name are appended to it.

    Returns:
        ``(targets, abstract)``: the saved names the programs set, and every
        name the init group sets (its host steps' as saved).
    """
    abstract: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    nodes: dict[str, str] = {}
    steps = session.steps(job.init_group)
    for step in steps:
        if isinstance(step, Program):
            if meshes is None:
                produced = step.abstract(abstract)
            else:
                produced, jaxpr = step.shapes(abstract)
                meshes.extend(_meshes_in(jaxpr))
            targets.update(produced)
            abstract.update(produced)
            nodes.update(step.producers)
        else:
            abstract.update({k: v for k, v in saved.items() if k not in abstract})
    loaded = loaded_nodes(manager)
    checks.check_resume_names(
        [k for k in targets if loaded is None or nodes.get(k) in loaded],
        saved,
        exact=all(isinstance(step, Program) for step in steps),
        epoch=epoch,
        where=manager.db_prefix,
    )
    return {k: v for k, v in targets.items() if k in saved}, abstract


def _with_saved_shardings(
    targets: dict[str, Any], as_saved: dict[tuple[str, ...], Any], meshes: list[Any]
) -> dict[str, Any] | None:
    """``targets`` (the init group's shapes and dtypes) with the shardings they were saved with.

    Leaves are matched by key path. None (trace the job's own shardings
    instead) if a leaf's path, shape or dtype differs from the saved one (the
    restore then says how), or if the job names a mesh that no saved leaf is
    on: the context mesh (``JobRunner(mesh=)``), or one the init group's
    programs use (``meshes``, and those of their explicit-axes outputs): its
    shardings were changed since the save.
    """
    named = [leaf.sharding.mesh for leaf in jax.tree.leaves(targets) if _on_mesh(leaf)]
    context = jax.sharding.get_abstract_mesh()
    if not _meshes_saved([*meshes, *named, *([] if context.empty else [context])], as_saved):
        return None
    found = {}
    for name, target in targets.items():
        flat, tree = jax.tree_util.tree_flatten_with_path(target)
        leaves = []
        for path, leaf in flat:
            saved = as_saved.get((name, *keypaths.entry_segments(path)))
            if saved is None or (saved.shape, saved.dtype) != (leaf.shape, leaf.dtype):
                return None
            leaves.append(saved)
        found[name] = jax.tree_util.tree_unflatten(tree, leaves)
    return found


def _on_mesh(leaf: Any) -> bool:
    """Whether ``leaf`` has a named sharding (a mesh), not one device's."""
    return hasattr(getattr(leaf, "sharding", None), "mesh")


def _meshes_saved(meshes: list[Any], as_saved: dict[tuple[str, ...], Any]) -> bool:
    """Whether every mesh of ``meshes`` is one a saved leaf is on (an abstract one: abstractly)."""
    saved = {s.sharding.mesh for s in as_saved.values() if _on_mesh(s)}
    abstract = {m.abstract_mesh for m in saved}
    return all(m in saved or m in abstract for m in meshes)


def _meshes_in(jaxpr: Any) -> list[Any]:
    """The meshes of the named shardings a jaxpr's equations name (constraints, device_puts)."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, jax.sharding.NamedSharding):
            found.append(value.mesh)
        elif isinstance(value, jax.extend.core.ClosedJaxpr):
            walk(value.jaxpr)
        elif isinstance(value, jax.extend.core.Jaxpr):
            for eqn in value.eqns:
                walk(list(eqn.params.values()))
        elif isinstance(value, tuple | list):
            for item in value:
                walk(item)

    walk(jaxpr)
    return found


def loaded_nodes(reader: Reader) -> set[str] | None:
    """The nodes whose checkpoints this process resumes from; None: every node."""
    return reader.resumed_nodes()
