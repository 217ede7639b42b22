"""What the session holds after Ctrl-C: a completed epoch's live arrays, never donated buffers.

An epoch group's jitted programs donate the workspace's buffers, so a
KeyboardInterrupt that lands inside an epoch, after its first program,
leaves the previous epoch's arrays deleted; the session then holds that
epoch's partial values (:attr:`jaxjob.Session.partial`). The runner, once
the save in flight is complete, puts back the last completed epoch's
workspace if none of its arrays was donated, or else restores the newest
committed epoch of either tier into the session (one process; a
multi-process job would have to restore on every process, so there the
session keeps the partial values and a warning says so).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import jax

from jaxjob._src.base.log import get_logger
from jaxjob._src.base.preemption import HeldSignal
from jaxjob._src.core.session import Session, consumed
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.run.protocol import Manager, Reader, tiers_of

__all__ = ["settle_workspace"]

logger = get_logger("jaxjob.runner")


def settle_workspace(
    session: Session,
    completed: tuple[int, Workspace] | None,
    manager: Manager,
    load: Callable[[Session, Reader, int], None],
) -> None:
    """After Ctrl-C: makes ``session`` hold a completed epoch's live arrays.

    Args:
        session: The interrupted session.
        completed: ``(epoch, workspace)`` of the last epoch completed before
            the one interrupted (None: the epoch loop had not started).
        manager: The runner's checkpoint manager (a ``NullManager`` without one).
        load: Restores an epoch of a tier's reader into the session (the runner's).
    """
    if not (session.partial or consumed(session.workspace)):
        return  # a completed epoch's: the interrupt came outside the epoch group's programs
    if completed is not None and not consumed(completed[1]):
        session.workspace, session.partial = completed[1], False
        return
    found = _newest_committed(manager)
    if found is None:
        logger.warning(
            "Interrupted after a jitted program had consumed (donated) the workspace's arrays: "
            "the session holds the interrupted group's partial values (%s)",
            "no checkpoint is committed"
            if jax.process_count() == 1
            else "restoring the last committed epoch would need every process",
        )
        return
    epoch, source = found
    with HeldSignal(signal.SIGINT, f"the restore of epoch {epoch} into the session"):
        load(session, source, epoch)
    session.partial = False
    logger.info(
        "Interrupted after a jitted program had consumed (donated) the workspace's arrays: "
        "epoch %d, the newest committed, restored into the session from %s",
        epoch,
        source.db_prefix,
    )


def _newest_committed(manager: Manager) -> tuple[int, Reader] | None:
    """``(epoch, reader of its tier)`` of the newest committed epoch here, or None."""
    if jax.process_count() > 1:
        return None
    found = [(e, t.reader) for t in tiers_of(manager) for e in t.committed_epochs()[-1:]]
    return max(found, key=lambda pair: pair[0]) if found else None
