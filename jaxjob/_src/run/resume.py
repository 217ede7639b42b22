"""Where a ``train`` starts: from scratch, or from which epoch of which tier, and restored how.

Process 0 decides the epoch (its metadata handler's newest, or
``resume_from_epoch``) and the life's id (:func:`resume_epoch`). With a local
tier and auto-resume, every process lists its local epochs newer than that
one (:func:`local_choice`): the newest every process holds, from one life,
that restores everywhere is resumed; else the persistent epoch. The restore
targets come from the init group (:mod:`jaxjob._src.run.targets`). Local
epochs newer than the one resumed (a killed life's) are dropped. A resumed
checkpoint that already meets a stop condition is a finished job.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import jax

from jaxjob._src.base.checks import is_int
from jaxjob._src.base.log import get_logger
from jaxjob._src.base.status import status_logger
from jaxjob._src.checkpoint.hostlocal import ProcessCountError
from jaxjob._src.core import data
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Session
from jaxjob._src.manager.local_tier import LOCAL, PERSISTENT
from jaxjob._src.multihost import hosts
from jaxjob._src.run import shardings
from jaxjob._src.run.agreement import any_process
from jaxjob._src.run.protocol import Manager, Reader, tiers_of
from jaxjob._src.run.targets import restore_targets

__all__ = [
    "LocalChoice",
    "Resume",
    "check_resume_from",
    "data_count_error",
    "local_choice",
    "resume_epoch",
]

logger = get_logger(__name__)


def check_resume_from(resume_from_epoch: Any) -> int | None:
    """Returns ``JobRunner``'s ``resume_from_epoch`` if it is None or an int >= 0.

    Raises:
        ValueError: Naming the argument and what it got.
    """
    if resume_from_epoch is not None and not (is_int(resume_from_epoch) and resume_from_epoch >= 0):
        raise ValueError(
            f"resume_from_epoch must be None or an int >= 0, got {resume_from_epoch!r}"
        )
    return resume_from_epoch


def resume_epoch(
    manager: Manager, requested: int | None, nodes: list[str], timeout_s: float
) -> tuple[int | None, str]:
    """The epoch to resume from (None: from scratch) and this life's id, as process 0 decides them.

    The life (attempt: one ``train`` call) gets one id on every process:
    process 0's, sent with the resume epoch. Every checkpoint this life saves
    records it (each tier's ``set_lineage``).

    Args:
        manager: The runner's checkpoint manager (a ``NullManager`` without one).
        requested: The runner's ``resume_from_epoch``; None lets the metadata handler pick.
        nodes: The nodes the job checkpoints.
        timeout_s: How long to wait for process 0's answer.

    Returns:
        ``(epoch, life)``.
    """
    manager.set_params(nodes=nodes)
    decided = hosts.decide(
        "the resume epoch",
        lambda: {"epoch": manager.get_resume_from_epoch_id(requested), "life": uuid.uuid4().hex},
        timeout_s=timeout_s,
    )
    resume = decided["epoch"]
    two_tiers = manager.tier(LOCAL) is not None and requested is None
    if resume is not None and not two_tiers:  # else Resume.restore says which tier
        status_logger().info("Resuming from epoch %d (%s)", resume, manager.db_prefix)
    return resume, decided["life"]


class Resume:
    """The start of one ``train`` call: process 0's decision, then the restore (every process).

    Args:
        job: The job.
        manager: The runner's checkpoint manager (a ``NullManager`` without one).
        requested: The runner's ``resume_from_epoch``.
        nodes: The nodes the job checkpoints.
        timeout_s: How long a wait on the other processes may take.

    Attributes:
        epoch: The persistent epoch process 0 chose (None: from scratch).
        life: This life's id (process 0's).
        deferred: Whether the restored state's shardings wait for the first
            epoch (:func:`jaxjob._src.run.shardings.epoch_shardings`).
    """

    def __init__(
        self, job: Job, manager: Manager, requested: int | None, nodes: list[str], timeout_s: float
    ) -> None:
        self.job, self.manager, self.requested = job, manager, requested
        self.nodes, self.timeout_s = nodes, timeout_s
        self.epoch, self.life = resume_epoch(manager, requested, nodes, timeout_s)
        self.deferred = False

    def from_scratch(self, session: Session) -> None:
        """Takes the manager's locks for a fresh life; drops every local epoch (another life's)."""
        self.manager.init(self.nodes, key_nodes=session.key_nodes)
        self._record_life(None)
        self._forget_local(None)

    def restore(self, session: Session) -> tuple[str, int]:
        """Restores the newest epoch intact on every process, from either tier: ``(tier, epoch)``.

        Without a local tier (or with ``resume_from_epoch``) that is the
        persistent tier's ``epoch``. Otherwise every process lists its local
        tier (one exchange); the newest local epoch newer than it that every
        process holds is restored, and if it does not restore on some process
        (a damaged array), the next older one; else the persistent epoch. One
        INFO line says which tier, epoch and why. The saves of this life
        record the epoch resumed.
        """
        self.manager.init(self.nodes, retrieve_from_epoch=self.epoch)
        tier, epoch = self._restore(session, self.epoch)
        self._record_life(epoch)
        return tier, epoch

    def _record_life(self, resumed_from: int | None) -> None:
        """The saves of this life, to either tier, record it and the epoch it resumed from."""
        for tier in tiers_of(self.manager):
            tier.set_lineage(self.life, resumed_from)

    def _restore(self, session: Session, persistent: int) -> tuple[str, int]:
        if self.manager.tier(LOCAL) is None or self.requested is not None:
            return self._restore_persistent(session, persistent)
        choice = local_choice(self.manager, persistent, self.timeout_s)
        for epoch in choice.epochs:
            if self._restore_local(session, epoch, choice.why):
                status_logger().info(
                    "Resuming from epoch %d of the local tier (%s): the newest epoch intact on "
                    "every process; the persistent tier's newest is %d%s",
                    epoch, self.manager.tier(LOCAL).db_prefix, persistent,
                    "; passed over: " + "; ".join(choice.why) if choice.why else "",
                )  # fmt: skip
                self._forget_local(epoch)
                return LOCAL, epoch
        status_logger().info(
            "Resuming from epoch %d of the persistent tier (%s): %s",
            persistent, self.manager.db_prefix,
            "; ".join(choice.why) or "no local epoch is newer",
        )  # fmt: skip
        return self._restore_persistent(session, persistent)

    def _restore_local(self, session: Session, epoch: int, why: list[str]) -> bool:
        """Restores local ``epoch`` if it restores on every process; else appends why not."""
        local = self.manager.tier(LOCAL)
        failed: Exception | None = None
        try:  # what restore_targets reads before its own exchange, read first
            local.reader.saved_shapes(epoch)
            local.reader.saved_targets(epoch)
        except Exception as err:  # noqa: BLE001 (any reason; every process tries the next)
            failed = err
        what = f"the local epoch {epoch}'s manifest"
        if not any_process(what, failed is not None, self.timeout_s):
            try:
                self.load(session, local.reader, epoch)
            except hosts.HostTimeoutError:
                raise
            except Exception as err:  # noqa: BLE001 (a damaged copy here: try the next)
                failed = err
        where = any_process(
            f"the restore of local epoch {epoch}", failed is not None, self.timeout_s
        )
        local.report_stats("checkpoint_load")
        if where:
            why.append(f"local epoch {epoch} did not restore on processes {where}")
            if failed is not None:
                logger.warning("Local epoch %d did not restore here: %s", epoch, failed)
        return not where

    def _restore_persistent(self, session: Session, epoch: int) -> tuple[str, int]:
        """Restores the persistent tier's ``epoch``; drops the local epochs newer than it.

        With ``resume_from_epoch`` too: the branch the user left is never resumed.
        """
        self.load(session, self.manager.tier(PERSISTENT).reader, epoch)
        self.manager.report_checkpoint_stats("checkpoint_load")
        self._forget_local(epoch)
        return PERSISTENT, epoch

    def _forget_local(self, epoch: int | None) -> None:
        """Drops local epochs newer than ``epoch`` (all on a fresh start): another life's."""
        local = self.manager.tier(LOCAL)
        if local is not None:
            local.forget(epoch)

    def load(self, session: Session, source: Reader, epoch: int) -> None:
        """Restores ``epoch`` of ``source`` (a tier's reader) into ``session``.

        Raises:
            ValueError: If the checkpoint holds other names than the init group
                sets, or per-process data states for another process count.
        """
        targets, self.deferred = restore_targets(self.job, session, source, epoch)
        placed = {**shardings.as_saved(source, epoch, targets), **targets}  # host tasks' too
        try:
            session.workspace = shardings.movable(source.load(epoch, targets=placed))
        except ProcessCountError as err:
            raise data_count_error(err, self.job, epoch) or err from None
        session.traced_names = set(targets)

    def finished(self, session: Session, tier: str, epoch: int) -> bool:
        """Whether the resumed checkpoint meets a stop condition (auto-resume; every process).

        Its saved outputs are loaded for the conditions; a finished job says so.
        """
        if self.requested is not None or epoch == 0:
            return False
        source = self.manager.tier(tier).reader
        values, _ = self.job.stop_values(session.workspace.set(source.load_outputs(epoch)))
        stopped = any_process(f"the stop conditions of epoch {epoch}", any(values), self.timeout_s)
        if stopped:
            _say_finished(self.job, epoch)
        return bool(stopped)


def _say_finished(job: Job, epoch: int) -> None:
    """The status line of a job whose checkpoint ``epoch`` already meets a stop condition."""
    limit = getattr(job, "epoch_limit", None)
    if limit is not None and limit < epoch:
        status_logger().info(
            "Already finished at epoch %d: epoch_limiter's limit of %d epochs is below the %d "
            "epochs done; nothing to run (pass a larger limit to continue)", epoch, limit, epoch,
        )  # fmt: skip
    else:
        status_logger().info(
            "Already finished at epoch %d: its checkpoint meets a stop condition; nothing to run",
            epoch,
        )


@dataclasses.dataclass(frozen=True)
class LocalChoice:
    """The local tier's epochs that every process can resume from, and why others cannot.

    Attributes:
        epochs: Newer than the persistent tier's resume epoch, newest first,
            committed and intact (manifest, file table) on every process.
        why: Why a newer local epoch is not among them (one clause each).
    """

    epochs: list[int]
    why: list[str]


def local_choice(manager: Manager, persistent: int | None, timeout_s: float) -> LocalChoice:
    """The local epochs newer than ``persistent`` that every process holds (one exchange).

    Every process lists its own local tier; an epoch counts only if every
    process can resume from it, so processes never resume from a mix of
    epochs, and only if every process's copy of it comes from the same life
    of the job and their replicated leaves' checksums agree, so they never
    resume from a mix of lives (a host that missed a life kept its copies).
    """
    local = manager.tier(LOCAL)
    mine, why = local.candidates(persistent)
    several = jax.process_count() > 1
    lineage = local.lineage(mine) if several else {}
    post = {"epochs": mine, "why": why[:4], "lineage": {str(e): v for e, v in lineage.items()}}
    posts = hosts.exchange("the local tier's epochs", post, timeout_s=timeout_s)
    held = [set(p["epochs"]) for p in posts]
    common, anywhere = set.intersection(*held), set.union(*held)
    reasons: list[str] = []
    for process, post in enumerate(posts):
        lacking = sorted(anywhere - held[process])
        where = f"process {process}" if len(posts) > 1 else "this process"
        reasons += [f"{where}: {line}" for line in post["why"]]
        if lacking and not post["why"]:
            reasons.append(f"{where} has no local epoch {lacking}")
    for epoch in sorted(common, reverse=True) if several else []:
        mixed = _mixed_lineage([p["lineage"].get(str(epoch)) for p in posts])
        if mixed is not None:
            common.discard(epoch)
            reasons.append(f"local epoch {epoch}: {mixed}")
    if common:  # what the processes lack above the chosen epoch is all that matters
        newest = max(common)
        reasons = [r for r in reasons if not _only_older(r, newest)]
    return LocalChoice(sorted(common, reverse=True), reasons)


def _mixed_lineage(found: list[dict[str, Any] | None]) -> str | None:
    """Why the processes' copies of a local epoch are not one life's state, or None."""
    if any(f is None for f in found):
        missing = [p for p, f in enumerate(found) if f is None]
        return f"its life does not read on processes {missing}"
    lives = [f["life"] for f in found]
    if len(set(lives)) > 1:
        return (
            f"the processes' copies come from different lives of the job (life by process: "
            f"{lives}): a host that missed a life kept its copies"
        )
    wholes = [f["whole"] for f in found]
    for name in sorted(set.intersection(*(set(w) for w in wholes))):
        crcs = [w[name] for w in wholes]
        if len(set(crcs)) > 1:
            return f"its replicated leaf {name!r} differs between the processes (CRC-32C {crcs})"
    return None


def _only_older(reason: str, newest: int) -> bool:
    """Whether ``reason`` is about local epochs no newer than ``newest`` alone."""
    found = re.findall(r"local epochs? \[?([\d, ]+)\]?", reason)
    epochs = [int(e) for group in found for e in re.findall(r"\d+", group)]
    return bool(epochs) and max(epochs) <= newest


def data_count_error(err: ProcessCountError, job: Job, epoch: int) -> ValueError | None:
    """The error for per-process data states resumed on another process count; None if none is.

    A per-process loader's position (:class:`jaxjob.data.Stateful`) cannot be
    split over another number of processes; index-based states are one value
    for the whole job and never get here. The message names every host-local
    leaf of ``err``, the data states and the others.
    """
    states = data.per_process_states(err.leaves, job.data_sources)
    if not states:
        return None
    own = {f"[{key!r}]" for key in states}
    others = [leaf for leaf in err.leaves if leaf not in own]
    also = (
        f" The other host-local leaves {others} cannot be split over another process count "
        "either; host_map chooses the saved copy each process gets for them too."
        if others
        else ""
    )
    return ValueError(
        f"cannot resume the data of epoch {epoch}: the per-process loader states {states} "
        f"(jaxjob.data.Stateful) were saved by {err.saved_count} processes but this job has "
        f"{err.count}, and a per-process loader's position cannot be split over another "
        f"process count. Resume on {err.saved_count} processes; or feed the job from an "
        "index-based source, whose one global cursor is split over any process count "
        "(jaxjob.data.IndexCursor, or jaxjob.data.Stateful(loader, shared=True) over Grain's "
        "ElasticIterator); or, for a loader that accepts another process's state, pass "
        "CheckpointManager(..., host_map=...) to choose the saved state each process continues "
        "from (samples may then be read twice or not at all)." + also
    )
