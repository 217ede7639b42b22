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

from jaxjob._src.base.log import get_logger
from jaxjob._src.core import checks
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Program, Session
from jaxjob._src.manager.shared import Manager
from jaxjob._src.multihost import hosts
from jaxjob._src.run import shardings

__all__ = ["loaded_nodes", "restore_targets", "resume_epoch"]

logger = get_logger(__name__)


def resume_epoch(
    manager: Manager | None, requested: int | None, nodes: list[str], timeout_s: float
) -> int | None:
    """The epoch to resume from (None: from scratch), as process 0 decides it for every process.

    Args:
        manager: The runner's checkpoint manager; without one, ``requested`` is the answer.
        requested: The runner's ``resume_from_epoch``; None lets the metadata handler pick.
        nodes: The nodes the job checkpoints.
        timeout_s: How long to wait for process 0's answer.
    """
    if manager is None:
        return requested
    manager.set_params(nodes=nodes)
    resume = hosts.decide(
        "the resume epoch",
        lambda: manager.get_resume_from_epoch_id(requested),
        timeout_s=timeout_s,
    )
    if resume is not None:
        logger.info("Resuming from epoch %d", resume)
    return resume


def restore_targets(
    job: Job, session: Session, manager: Manager, epoch: int
) -> tuple[dict[str, Any], bool]:
    """The targets of the restore of ``epoch``, and whether their shardings wait for an epoch.

    Returns:
        ``(targets, deferred)`` as :func:`jaxjob._src.run.shardings.epoch_shardings` gives them.

    Raises:
        ValueError: If the checkpoint holds other names than the init group sets.
    """
    saved = manager.saved_shapes(epoch)
    as_saved = manager.saved_targets(epoch)
    if as_saved is not None:
        targets, _ = _init_targets(job, session, manager, epoch, saved, compiled=False)
        found = _with_saved_shardings(targets, as_saved)
        if found is not None:
            logger.debug("Restoring epoch %d with the shardings it was saved with", epoch)
            return found, False
    targets, abstract = _init_targets(job, session, manager, epoch, saved, compiled=True)
    return shardings.epoch_shardings(session, job.epoch_group, epoch, abstract, targets)


def _init_targets(
    job: Job,
    session: Session,
    manager: Manager,
    epoch: int,
    saved: dict[str, Any],
    *,
    compiled: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the init group's programs set, checked against the names saved at ``epoch``.

    With ``compiled``, the programs are compiled for their output shardings;
    without, only evaluated abstractly (shapes and dtypes).

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
            produced = step.abstract(abstract) if compiled else step.shapes(abstract)
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
    targets: dict[str, Any], as_saved: dict[str, Any]
) -> dict[str, Any] | None:
    """``targets`` (the init group's shapes and dtypes) with the saved shardings.

    Both trees' leaves are in JAX's flattening order (the saved tree is
    rebuilt from JSON: a NamedTuple comes back as a tuple). None if a name's
    leaves, shapes or dtypes differ from the saved ones (the restore then
    says how).
    """
    found = {}
    for name, target in targets.items():
        saved = as_saved.get(name)
        leaves, tree = jax.tree.flatten(target)
        stored = jax.tree.leaves(saved)
        if saved is None or len(stored) != len(leaves):
            return None
        if any(
            (a.shape, a.dtype) != (b.shape, b.dtype) for a, b in zip(leaves, stored, strict=True)
        ):
            return None
        found[name] = jax.tree.unflatten(
            tree,
            [
                jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=b.sharding)
                for a, b in zip(leaves, stored, strict=True)
            ],
        )
    return found


def loaded_nodes(manager: Manager) -> set[str] | None:
    """The nodes whose checkpoints this process resumes from; None: every node."""
    managers = manager.node_managers
    if len(managers) == 1:
        return None
    me = jax.process_index()
    return {name for name, m in managers if getattr(m, "owner_process", None) in (None, me)}
