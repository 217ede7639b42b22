"""The runner's saves: when each tier's save is due, the save, its failures, finishing the saves.

The persistent tier saves on the runner's interval (``save_every_*``), the
local tier on its own (``LocalTier(every_epochs=, every_seconds=)``); an epoch
saved to the persistent tier is not saved locally too, and either tier's save
restarts the local interval. A failure goes to the ``on_save_error`` policy
(:class:`jaxjob._src.run.save_failures.SaveFailures`). A manager without tiers
(the runner's :class:`jaxjob._src.run.protocol.NullManager`) is never due to save.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxjob._src.base.errors import CheckpointSaveError, Preempted, as_save_error, earlier_failure
from jaxjob._src.checkpoint.layout import db_name
from jaxjob._src.checkpoint.leaf_spec import UnstorableLeafError
from jaxjob._src.core.session import Session
from jaxjob._src.manager.local_tier import LOCAL, PERSISTENT
from jaxjob._src.multihost import hosts
from jaxjob._src.run.agreement import Boundary, agree_boundary
from jaxjob._src.run.auto_interval import AutoInterval
from jaxjob._src.run.history import HistoryFile, NoHistory
from jaxjob._src.run.interval import SaveClock, SaveInterval
from jaxjob._src.run.protocol import Manager, tiers_of
from jaxjob._src.run.save_failures import SaveFailures

__all__ = ["Saving"]


class Saving:
    """The saves of one runner to its manager's tiers.

    Args:
        manager: The runner's manager (a :class:`NullManager` without one).
        failures: The runner's ``on_save_error`` policy and its failures.
        interval: The persistent tier's interval (``JobRunner.save_interval``).
        nodes: The job's checkpointed nodes (the first names a failed save).

    Attributes:
        clock: When and at which epoch the persistent tier last saved.
        local: The local tier's interval and clock, or None: one tier.
    """

    def __init__(
        self,
        manager: Manager,
        failures: SaveFailures,
        interval: SaveInterval | AutoInterval,
        nodes: Callable[[], list[str]],
    ) -> None:
        self.manager = manager
        self.failures = failures
        self.interval = interval
        self._nodes = nodes
        self.clock = SaveClock()
        self.local: tuple[SaveInterval, SaveClock] | None = None

    @property
    def tiers(self) -> list[str]:
        """The tiers saved to; none without a checkpoint manager."""
        return [tier.name for tier in tiers_of(self.manager)]

    def begin(self) -> None:
        """A ``train`` starts: the local tier's interval counts from epoch 0 (until resumed)."""
        local = self.manager.tier(LOCAL)
        self.local = None
        if local is not None:
            tier = local.settings
            interval = SaveInterval(
                every_epochs=tier.every_epochs, every_seconds=tier.every_seconds
            )
            self.local = (interval, SaveClock(0))

    def restart(self) -> None:
        """The init group ran: the persistent interval counts from epoch 0 (an auto one: now)."""
        self.clock = SaveClock(0)

    def first(self, session: Session) -> None:
        """Saves epoch 0 after the init group (and :meth:`restart`)."""
        if not self.tiers:
            return
        saving = time.perf_counter()
        self.save_checkpoints(0, session)
        self._cost(time.perf_counter() - saving, provisional=True)
        if not isinstance(self.interval, AutoInterval):
            self.clock = SaveClock(0)  # save_every_seconds: from after that save

    def resumed_local(self, epoch: int) -> None:
        """The local interval counts from the resumed ``epoch``."""
        if self.local is not None:
            self.local = (self.local[0], SaveClock(epoch))

    def resumed(self, persistent: int, resumed: int) -> None:
        """The persistent interval after resuming from ``resumed`` (``persistent``: its newest).

        It counts from the persistent tier's own last save, also after a
        resume from a newer local epoch, so that its epochs stay those of an
        uninterrupted run: with ``save_every_epochs=k``, the last multiple of
        ``k`` epochs after ``persistent`` that ``resumed`` reached (a save
        started there and was lost).
        """
        every = getattr(self.interval, "every_epochs", None)
        epoch = persistent + (resumed - persistent) // every * every if every else persistent
        self.clock = SaveClock(epoch)

    def boundary(self, epoch: int, *, stop: bool, preempted: bool, timeout_s: float) -> Boundary:
        """What every process agrees at the end of ``epoch`` (one exchange)."""
        return agree_boundary(
            epoch,
            stop=stop,
            preempted=preempted,
            interval=self.interval,
            clock=self.clock,
            failures=self.failures,
            manager=self.manager,
            timeout_s=timeout_s,
            local=self.local,
        )

    def save_epoch(
        self,
        epoch: int,
        session: Session,
        boundary: Boundary,
        run: Mapping[str, Any],
        *,
        read: list[str],
        record: dict[str, Any],
        store: HistoryFile | NoHistory,
    ) -> tuple[str | None, float]:
        """Saves ``epoch`` to the tier ``boundary`` makes due, if any: ``(tier, seconds)``.

        ``record`` (the epoch's values) goes to the history ``store`` first;
        ``read`` (what the stop conditions read) and the manager's
        ``required_outputs`` are saved with it. The seconds are the training
        thread's, after the epoch's arrays are ready.
        """
        if not (self.tiers and (boundary.save or boundary.local)):
            return None, 0.0
        tier = PERSISTENT if boundary.save else LOCAL
        store.saving({**record, **({"saved_to": tier} if self.local is not None else {})})
        wanted = [*read, *self.manager.tier(PERSISTENT).required_outputs]
        outputs = {k: run[k] for k in wanted if k in run and k not in session.workspace}
        jax.block_until_ready(run)  # the save's copy would wait for it: not save time
        saving = time.perf_counter()
        if self.local is not None:
            self.local[1].saved(epoch)  # either tier's save restarts the local interval
        if boundary.save:
            self.clock.saved(epoch)
            self.save_checkpoints(epoch, session, outputs=outputs)
        else:
            self.save_local(epoch, session, outputs)
        save_time_s = time.perf_counter() - saving
        if boundary.save:
            self._cost(save_time_s)
        return tier, save_time_s

    def _cost(self, save_time_s: float, *, provisional: bool = False) -> None:
        """A save took ``save_time_s`` of the training thread: the cost an auto interval uses."""
        if isinstance(self.interval, AutoInterval):
            self.interval.record(save_time_s, provisional=provisional)

    def save_checkpoints(
        self, epoch: int, session: Session, *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Saves the workspace as checkpoint ``epoch`` (see ``JobRunner.save_checkpoints``)."""
        if not self.tiers:
            raise ValueError("save_checkpoints needs a checkpoint_manager")
        manager = self.manager
        try:
            manager.cp_accessible(epoch=None)  # the manager posts the answer with the save
            try:
                manager.save(epoch, session.workspace, outputs=outputs)
            except CheckpointSaveError as err:
                if err.epoch == epoch:
                    raise
                self.failures.handle(err, manager)
            manager.write_checkpoint_metadata(epoch)
            manager.report_checkpoint_stats("checkpoint_save")
        except (hosts.HostTimeoutError, UnstorableLeafError):
            raise  # the job cannot go on without the other process; no save of it can succeed
        except Exception as err:
            self._failed(epoch, err)
        self.failures.metadata(manager)

    def _failed(self, epoch: int, err: Exception) -> None:
        """Hands the failure of the save of ``epoch`` (and a previous one found with it) over."""
        earlier = earlier_failure(err)  # the previous save's, found in the same round
        if earlier is not None:
            self.failures.handle(earlier, self.manager)
        if not isinstance(err, CheckpointSaveError) or err.epoch == epoch:
            where = db_name(epoch, self._nodes()[0], self.manager.db_prefix)
            self.failures.handle(as_save_error(epoch, where, err), self.manager)
        else:
            raise err

    def save_local(self, epoch: int, session: Session, outputs: Mapping[str, Any]) -> None:
        """Saves ``epoch`` to this process's local tier; a failure goes to ``on_save_error``.

        In a multi-process job the failure is handled on every process at the
        next epoch boundary (each process writes its own local tier).
        """
        manager = self.manager
        try:
            manager.tier(LOCAL).save(epoch, session.workspace, outputs=outputs)
        except (hosts.HostTimeoutError, UnstorableLeafError):
            raise
        except Exception as err:
            where = manager.tier(LOCAL).db_prefix
            earlier = earlier_failure(err)
            found = [earlier] if earlier is not None else []
            self.failures.local([*found, as_save_error(epoch, where, err)], manager)
        self.failures.metadata(manager)  # a persistent epoch's record written meanwhile

    def finish(self, timeout_s: float) -> None:
        """Waits for the saves in flight; their failures go to the policy (every process)."""
        self.failures.finish(self.manager, timeout_s)

    def complete_pending(self, *, interrupted: bool) -> None:
        """Completes this process's saves in flight, without waiting on other processes."""
        self.failures.complete_pending(self.manager, interrupted=interrupted)

    def preempted(self, epoch: int, timeout_s: float) -> Preempted:
        """The exception for a preemption after ``epoch`` (the newest committed epoch's)."""
        return self.failures.preempted(epoch, self.manager, timeout_s)
