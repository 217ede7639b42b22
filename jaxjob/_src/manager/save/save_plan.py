"""One process's part of one node's save, prepared before the processes agree to start it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CheckpointSaveError
from jaxjob._src.checkpoint import manifest
from jaxjob._src.manager.records import LeafCheck, SavePost, Stats, error_text

__all__ = ["Pending", "SavePlan", "post_plan", "prepare_prefix"]


@dataclasses.dataclass
class Pending:
    """A save of this process: started, or being prepared."""

    epoch: int
    db: str
    started: float
    superseded: str | None = None
    deadline: float | None = None  # on object stores: when its background write has failed
    starting: bool = False  # Orbax's save() has not returned: an interrupt may have stopped it
    start: concurrent.futures.Future | None = None  # a small save's start on the worker thread


@dataclasses.dataclass
class SavePlan:
    """One process's part of one node's save, prepared before the processes agree to start it.

    ``post`` is what this process tells the others; ``timeout_s`` is how
    long to wait for their posts.
    """

    epoch: int
    path: str
    pending: Pending
    timeout_s: float
    previous: CheckpointSaveError | None = None
    problem: Exception | None = None
    found: manifest.Manifest | None = None
    encoded: Any = None
    digests: dict[str, str] = dataclasses.field(default_factory=dict)
    bytes: int | None = None
    post: SavePost = dataclasses.field(default_factory=SavePost)


def prepare_prefix(db_prefix: str) -> None:
    """Creates ``db_prefix``, raising the OSError's own type with an actionable message."""
    try:
        fs.makedirs(db_prefix)
    except OSError as err:
        raise type(err)(
            f"checkpoint db_prefix {db_prefix!r} is not a writable directory "
            f"({err.strerror or err}); pass a directory you can write to"
        ) from err


def post_plan(plan: SavePlan) -> SavePlan:
    """Completes ``plan`` with its post: outcome, leaves to check, and this save's stats."""
    local = {
        s.path: LeafCheck(s.kind, s.dtype, tuple(s.shape))
        for s in (plan.found.leaves.values() if plan.found else ())
        if s.host_local
    }
    stats = Stats(
        plan.epoch,
        plan.bytes,
        error_text(plan.problem),
        time.perf_counter() - plan.pending.started,
    )
    plan.post = SavePost.outcome(
        plan.previous,
        plan.problem,
        host_local=local,
        replicated=plan.digests,
        stats={plan.path: stats},
    )
    return plan
