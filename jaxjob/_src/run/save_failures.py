"""Failed saves in the runner: the ``on_save_error`` policy, and failures shared between processes.

A failure is recorded (the runner's ``save_errors``, the metadata handler's
stats, the progress line), then logged (``"warn"``) or raised (``"raise"``).
Its records are logged by the runner's logger, ``jaxjob.runner``:
the one a user configures for what the runner says.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax

from jaxjob._src.base.errors import CheckpointSaveError, Preempted
from jaxjob._src.base.log import get_logger
from jaxjob._src.base.preemption import HeldSignal
from jaxjob._src.manager.local_tier import LOCAL
from jaxjob._src.manager.records import error_text
from jaxjob._src.multihost import hosts
from jaxjob._src.run.protocol import Manager, tiers_of

__all__ = ["SAVE_ERROR_POLICIES", "SaveFailures", "one_line"]

logger = get_logger(__name__)  # jaxjob.runner, as the runner's own
SAVE_ERROR_POLICIES = ("warn", "raise")


class SaveFailures:
    """The save failures of one runner, handed to its ``on_save_error`` policy.

    Args:
        policy: ``"warn"`` or ``"raise"`` (``JobRunner``'s ``on_save_error``).
        errors: The list every failure is appended to (``JobRunner.save_errors``).
        on_failed: Called with the epoch of each failure (the progress line).

    Raises:
        ValueError: If ``policy`` is neither (naming ``on_save_error``).
    """

    def __init__(
        self,
        policy: Literal["warn", "raise"],
        errors: list[CheckpointSaveError],
        on_failed: Callable[[int], None],
    ) -> None:
        if policy not in SAVE_ERROR_POLICIES:
            raise ValueError(f"on_save_error must be one of {SAVE_ERROR_POLICIES}, got {policy!r}")
        self.policy = policy
        self.errors = errors
        self._on_failed = on_failed
        # metadata records that failed here, to share at the next exchange (multi-process)
        self._unshared: list[CheckpointSaveError] = []

    def handle(self, err: CheckpointSaveError, manager: Manager) -> None:
        """Records ``err``, reports it in the manager's stats, then warns or raises it."""
        self.errors.append(err)
        self._on_failed(err.epoch)
        stats = {err.db_name: {"epoch": err.epoch, "error": error_text(err)}}
        manager.metadata_handler.report("checkpoint_save", stats)
        if self.policy == "raise":
            raise err
        logger.warning("Unable to write checkpoint for epoch %d: %s", err.epoch, one_line(err))
        logger.debug("The failure of the save of epoch %d:", err.epoch, exc_info=err)

    def metadata(self, manager: Manager) -> None:
        """Hands each metadata record that failed (EIO, ENOSPC, ...) to the policy.

        In a multi-process job only process 0 writes the metadata file: its
        failures ride on the next epoch's boundary exchange (or, after the
        last epoch, on one exchange of their own, :meth:`share_last`) so that
        every process handles the same :class:`CheckpointSaveError` at the
        same point.
        """
        failed = [f for tier in tiers_of(manager) for f in tier.take_metadata_failures()]
        self._share_or_handle(failed, manager)

    def local(self, failures: Sequence[CheckpointSaveError], manager: Manager) -> None:
        """Hands local-tier save failures to the policy (several processes: at the next exchange).

        Each process writes its own local tier: its failures ride on the next
        boundary exchange like the metadata records', so that every process
        handles them at the same point.
        """
        self._share_or_handle(failures, manager)

    def _share_or_handle(self, failures: Sequence[CheckpointSaveError], manager: Manager) -> None:
        """Several processes: keeps ``failures`` for the next exchange; one: hands each over now."""
        if jax.process_count() > 1:
            self._unshared += failures
            return
        for err in failures:
            self.handle(err, manager)

    def take_unshared(self) -> list[list[Any]]:
        """This process's failed metadata records and local saves, as posted.

        Each is ``[epoch, path, "Type: message"]``.
        """
        unshared, self._unshared = self._unshared, []
        return [[e.epoch, e.db_name, error_text(e)] for e in unshared]

    def shared(self, posts: Sequence[dict[str, Any]], manager: Manager) -> None:
        """Hands the failed metadata records of every process's post to the policy."""
        for process, post in enumerate(posts):
            for epoch, where, text in post.get("metadata", []):
                self.handle(CheckpointSaveError(epoch, where, text, [process]), manager)

    def share_last(self, manager: Manager, timeout_s: float) -> None:
        """After the last save: one exchange of the metadata records failed since the boundary."""
        if jax.process_count() == 1:
            return
        posts = hosts.exchange(
            "the metadata records of the last saves",
            {"metadata": self.take_unshared()},
            timeout_s=timeout_s,
        )
        self.shared(posts, manager)

    def finish(self, manager: Manager, timeout_s: float) -> None:
        """Waits for the saves in flight; their failures and the metadata's go to the policy."""
        try:
            manager.wait_until_finished()
        except CheckpointSaveError as err:
            self.handle(err, manager)
        self.local([f for t in tiers_of(manager) if t.name == LOCAL for f in t.finish()], manager)
        self.metadata(manager)
        self.share_last(manager, timeout_s)

    def preempted(self, epoch: int, manager: Manager, timeout_s: float) -> Preempted:
        """The exception for a preemption after ``epoch``: the newest committed epoch's.

        Raises:
            CheckpointSaveError: The last failure, if the save of ``epoch``
                failed and no epoch is committed.
        """
        if any(err.epoch == epoch for err in self.errors):
            committed = hosts.decide(
                "the newest committed epoch", manager.committed_epochs, timeout_s=timeout_s
            )
            if not committed:
                raise self.errors[-1]
            logger.warning("The save of epoch %d failed; %d is committed", epoch, committed[-1])
            epoch = committed[-1]
        return Preempted(epoch)

    def complete_pending(self, manager: Manager, *, interrupted: bool) -> None:
        """Completes this process's saves in flight, without waiting on other processes.

        Meanwhile SIGINT is logged and ignored: a second Ctrl-C must not tear the save.
        """
        if interrupted:
            logger.warning(
                "Interrupted (KeyboardInterrupt): %s",
                "completing the save in flight before stopping"
                if any(tier.has_pending() for tier in tiers_of(manager))
                else "no save was in flight; stopping",
            )
        with HeldSignal(signal.SIGINT, "the save in flight"):
            failures = [f for tier in tiers_of(manager) for f in tier.finish()]
        for err in failures:
            self.errors.append(err)
            logger.error("While handling an error, a pending save failed too: %s", one_line(err))
            logger.debug("The failure of the save of epoch %d:", err.epoch, exc_info=err)


def one_line(err: BaseException) -> str:
    """``err``'s message on one line: its first line, then how many more there are."""
    lines = str(err).strip().splitlines() or [type(err).__name__]
    more = f" (and {len(lines) - 1} more lines, logged at DEBUG)" if len(lines) > 1 else ""
    return lines[0] + more
