"""Resume targets: what the runner restores, traced from the init group and checked against a save.

The init group is traced abstractly (nothing runs): its jitted programs give
each name's shape, dtype and sharding, its host steps contribute the saved
shapes. The names are checked against the checkpoint's, then given the
shardings the epochs leave (:mod:`jaxjob._src.run.shardings`).
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
    abstract: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    nodes: dict[str, str] = {}
    steps = session.steps(job.init_group)
    for step in steps:
        if isinstance(step, Program):
            produced = step.abstract(abstract)
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
    targets = {k: v for k, v in targets.items() if k in saved}
    return shardings.epoch_shardings(session, job.epoch_group, epoch, abstract, targets)


def loaded_nodes(manager: Manager) -> set[str] | None:
    """The nodes whose checkpoints this process resumes from; None: every node."""
    managers = manager.node_managers
    if len(managers) == 1:
        return None
    me = jax.process_index()
    return {name for name, m in managers if getattr(m, "owner_process", None) in (None, me)}
