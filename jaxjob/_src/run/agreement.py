"""The end of an epoch: what every process agrees on (stop, preemption, save) in one exchange."""

from __future__ import annotations

import dataclasses

from jaxjob._src.base.log import get_logger
from jaxjob._src.multihost import hosts
from jaxjob._src.run.auto_interval import AutoInterval
from jaxjob._src.run.interval import SaveClock, SaveInterval
from jaxjob._src.run.protocol import Manager
from jaxjob._src.run.save_failures import SaveFailures

__all__ = ["Boundary", "agree_boundary", "any_process"]

logger = get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class Boundary:
    """What every process agreed at the end of an epoch."""

    stop: bool
    preempted: bool
    save: bool
    local: bool = False  # a save to the local tier (never with ``save``: that epoch is durable)


def agree_boundary(
    epoch: int,
    *,
    stop: bool,
    preempted: bool,
    interval: SaveInterval | AutoInterval,
    clock: SaveClock,
    failures: SaveFailures,
    manager: Manager,
    timeout_s: float,
    local: tuple[SaveInterval, SaveClock] | None = None,
) -> Boundary:
    """One exchange per epoch: stop conditions, preemption signals, process 0's clock.

    The failed metadata records of every process ride on it
    (:meth:`SaveFailures.take_unshared`). Call it on every process.

    Returns:
        Stop if a stop condition holds on any process, preempted if any
        process was signalled, and save if either holds or process 0's clock
        (or the epochs since the last save) makes a save due; with a
        ``local`` tier (its interval and clock), local if the epoch is not
        saved to the persistent tier and the local interval makes it due.
    """
    due_by_time = interval.due_by_time(clock.seconds_since())
    local_by_time = local is not None and local[0].due_by_time(local[1].seconds_since())
    posts = hosts.exchange(
        f"the stop conditions of epoch {epoch}",
        {
            "flag": bool(stop),
            "preempted": bool(preempted),
            "due_by_time": due_by_time,
            "local_by_time": local_by_time,
            "metadata": failures.take_unshared(),
        },
        timeout_s=timeout_s,
    )
    failures.shared(posts, manager)
    signalled = [p for p, post in enumerate(posts) if post["preempted"]]
    if signalled and not preempted:
        logger.warning("Processes %s were preempted: stopping after epoch %d", signalled, epoch)
    stop, preempted = any(p["flag"] for p in posts), bool(signalled)
    due = posts[0]["due_by_time"] or interval.due_by_epochs(epoch - clock.epoch)
    save = stop or preempted or due
    local_due = local is not None and (
        posts[0]["local_by_time"] or local[0].due_by_epochs(epoch - local[1].epoch)
    )
    return Boundary(stop=stop, preempted=preempted, save=save, local=local_due and not save)


def any_process(what: str, flag: bool, timeout_s: float) -> list[int]:
    """The processes where ``flag`` holds (every process calls this)."""
    posts = hosts.exchange(what, {"flag": bool(flag)}, timeout_s=timeout_s)
    return [p for p, post in enumerate(posts) if post["flag"]]
