"""The job runner: the seed's epoch-level training flow with checkpoints."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Sequence
from typing import Any, Literal

import jax

from jaxjob._src.base import faults
from jaxjob._src.base.checks import is_int
from jaxjob._src.base.errors import CheckpointSaveError, as_save_error, earlier_failure
from jaxjob._src.base.log import get_logger
from jaxjob._src.base.preemption import SignalWatch, check_signals
from jaxjob._src.base.status import status_logger
from jaxjob._src.checkpoint.codec import UnstorableLeafError
from jaxjob._src.checkpoint.hostlocal import ProcessCountError
from jaxjob._src.checkpoint.layout import db_name
from jaxjob._src.core import checks, data
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Session
from jaxjob._src.core.task import DEFAULT_NODE
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager.local_tier import LOCAL, PERSISTENT
from jaxjob._src.manager.shared import Manager
from jaxjob._src.multihost import hosts
from jaxjob._src.run import shardings
from jaxjob._src.run.agreement import Boundary, agree_boundary, any_process
from jaxjob._src.run.auto_interval import AutoInterval, save_policy
from jaxjob._src.run.history import HistoryFile, NoHistory
from jaxjob._src.run.interrupted import settle_workspace
from jaxjob._src.run.interval import SaveClock, SaveInterval
from jaxjob._src.run.progress import Progress, check_names
from jaxjob._src.run.resume import (
    data_count_error,
    local_choice,
    restore_targets,
    resume_epoch,
    set_lineage,
)
from jaxjob._src.run.save_failures import SAVE_ERROR_POLICIES, SaveFailures
from jaxjob._src.run.upload import UploadTaskGroupBuilder
from jaxjob._src.run.writers import MetricWriter, MultiWriter, check_writers

__all__ = ["JobRunner"]

logger = get_logger(__name__)


class JobRunner:
    """Runs a job with a checkpoint after init and after every epoch.

    ``train`` asks the manager for the epoch to resume from. From scratch it
    runs the init group and saves epoch 0; resuming from ``k`` it loads
    checkpoint ``k`` instead (init is not run). Then it runs epochs ``k+1,
    k+2, ...``: the epoch group, the stop conditions, a save; it stops after
    the first epoch where a condition holds. Auto-resume (no
    ``resume_from_epoch``) first evaluates the stop conditions on the
    checkpoint it resumes from: a finished job runs no more epochs. Then the
    upload group (after every save is committed), the download group and the
    exit group run.

    Args:
        job: The job.
        checkpoint_manager: A (multi-node) checkpoint manager, or None to run
            without checkpoints.
        resume_from_epoch: Resume from this epoch (epoch ``k+1`` runs);
            None lets the manager's metadata handler pick the latest.
        upload_task_group_builder: Builds the upload group.
        on_save_error: ``"warn"`` logs a failed save (with its epoch and
            exception), records it in the stats and ``save_errors`` and
            carries on; ``"raise"`` raises it.
        save_every_epochs: Save when this many epochs have passed since the
            last save; None to save on time alone.
        save_every_seconds: Save when this much wall time has passed since
            the last save; None to save on epochs alone. When both are set,
            either one makes a save due. Process 0's clock decides for every
            process. Epoch 0, the final epoch and a preempted epoch are
            always saved. Auto-resume takes the newest committed epoch, so
            the epochs after it run again (and reach the same values).
        save_every: ``"auto"`` (with ``mtbf_hours``) or a
            :class:`jaxjob.AutoInterval`: the interval is chosen from the
            measured cost of a save and the stated failure rate (Daly's
            optimum, see :class:`jaxjob.AutoInterval`), in place of
            ``save_every_epochs`` and ``save_every_seconds``.
        mtbf_hours: The job's mean time between failures, for
            ``save_every="auto"``.
        preemption_signals: From the start of ``train`` until the last
            epoch's save has committed, these signals ask for a preemption:
            the running epoch finishes, is saved (whatever the interval) and
            committed, the upload, download and exit groups do not run, and
            ``train`` raises :class:`jaxjob.Preempted` naming that epoch. A
            signal on any process stops every process after the same epoch.
            A second signal during that save is logged and ignored (it must
            not tear the save). The previous handlers are restored before
            ``train`` returns or raises. ``()`` leaves the signals alone; so
            does a runner without a checkpoint manager, or ``train`` called
            off the main thread.
        progress: Names of scalar epoch outputs or leaves to show after every
            epoch with the epoch's time and save time (a ``tqdm`` bar in a
            terminal or notebook, else one line per epoch on stdout; process
            0 only), and to record in ``history``. None shows nothing.
        writers: Metric writers that get every epoch's ``history`` record on
            process 0, e.g. ``[jaxjob.JsonlWriter("metrics.jsonl"),
            jaxjob.TensorBoardWriter("tb")]``; on resume, each is first
            given the rebuilt history (see :class:`jaxjob.MetricWriter`).
        mesh: A ``jax.sharding.Mesh`` that ``train`` enters with
            ``jax.set_mesh`` (needed for meshes with Explicit axes, the
            default of ``jax.make_mesh``: tasks then use
            ``jax.sharding.reshard(x, P(...))``).

    Attributes:
        history: One dict per epoch of the run: ``"epoch"``, the ``progress``
            names' values (floats),
            ``"epoch_time_s"`` (the epoch group and its save) and
            ``"save_time_s"`` (the part the training thread spent saving),
            with ``save_every="auto"`` ``"save_interval_s"`` (the interval then),
            and, after a save failure surfaced during that epoch's save,
            ``"save_failed"`` (the failed epochs; the progress line shows
            ``save FAILED``). With a checkpoint manager it survives a
            restart: process 0 writes each record to
            ``<db_prefix>/.jaxjob/history/<node>.jsonl`` (before the epoch's save
            can commit), and ``train`` resuming from epoch ``k`` starts it
            with the records of epochs ``1..k`` (the resumed epoch's lacks
            its times if the run died right after that save). Without one,
            each ``train`` starts it empty.
        save_errors: The save failures met under ``on_save_error="warn"``.

    Example:
        >>> import tempfile, jax.numpy as jnp
        >>> import jaxjob
        >>> job = jaxjob.Job()
        >>> _ = job.init_group.add(lambda ws: {"x": jnp.zeros(())})
        >>> _ = job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
        >>> jaxjob.epoch_limiter(job, 3)
        >>> ckpt = jaxjob.CheckpointManager(tempfile.mkdtemp())
        >>> session = jaxjob.Session()
        >>> jaxjob.JobRunner(job, ckpt).train(session), float(session.workspace["x"])
        (3, 3.0)
        >>> again = jaxjob.JobRunner(job, ckpt)
        >>> again.train(jaxjob.Session())  # finished: runs no epoch
        3
        >>> [record["epoch"] for record in again.history]  # rebuilt: the whole run
        [1, 2, 3]
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(
        self,
        job: Job,
        checkpoint_manager: Manager | None = None,
        resume_from_epoch: int | None = None,
        upload_task_group_builder: UploadTaskGroupBuilder | None = None,
        *,
        on_save_error: Literal["warn", "raise"] = "warn",
        progress: Sequence[str] | None = None,
        mesh: jax.sharding.Mesh | None = None,
        save_every_epochs: int | None = 1,
        save_every_seconds: float | None = None,
        save_every: Literal["auto"] | AutoInterval | None = None,
        mtbf_hours: float | None = None,
        preemption_signals: Sequence[signal.Signals | int] = (signal.SIGTERM,),
        writers: Sequence[MetricWriter] = (),
    ) -> None:
        if on_save_error not in SAVE_ERROR_POLICIES:
            raise ValueError(
                f"on_save_error must be one of {SAVE_ERROR_POLICIES}, got {on_save_error!r}"
            )
        if resume_from_epoch is not None and not (
            is_int(resume_from_epoch) and resume_from_epoch >= 0
        ):
            raise ValueError(
                f"resume_from_epoch must be None or an int >= 0, got {resume_from_epoch!r}"
            )
        self.job = job
        self.checkpoint_manager = checkpoint_manager
        self.resume_from_epoch = resume_from_epoch
        self.upload_task_group_builder = upload_task_group_builder
        self.save_errors: list[CheckpointSaveError] = []
        self._failures = SaveFailures(
            on_save_error, self.save_errors, lambda epoch: self._progress.save_failed(epoch)
        )
        self.progress = check_names(progress)
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
        self.mesh = mesh
        self.history: list[dict[str, Any]] = []
        self._progress = Progress(None, self.history)
        self.writers = check_writers(writers)
        self._writers = MultiWriter(())
        self._store: HistoryFile | NoHistory = NoHistory()
        self._warned: set[str] = set()
        self.save_interval = save_policy(
            save_every, mtbf_hours, save_every_epochs, save_every_seconds
        )
        self.preemption_signals = check_signals(preemption_signals)
        self._clock = SaveClock()
        self._local: tuple[SaveInterval, SaveClock] | None = None  # the local tier's schedule
        self._deferred_shardings = False

    @property
    def on_save_error(self) -> Literal["warn", "raise"]:
        """What a failed save does: ``"warn"`` or ``"raise"`` (see the class docstring)."""
        return self._failures.policy

    @on_save_error.setter
    def on_save_error(self, policy: Literal["warn", "raise"]) -> None:
        self._failures.policy = policy

    def _nodes(self) -> list[str]:
        return self.job.nodes_to_checkpoint() or [DEFAULT_NODE]

    def train(self, session: Session) -> int:
        """Runs the training flow on ``session`` and returns the last epoch.

        If it raises, saves in flight are completed before it returns.
        Call it on every process of a multi-process job: process 0 decides
        the resume epoch for all, and a stop condition that holds on any
        process stops every process.

        Raises:
            ValueError: If the checkpoint resumed from does not hold the names
                the init group creates (or holds names it no longer creates).
            Preempted: After a preemption signal, once the epoch it stopped
                after is saved and committed.
            KeyboardInterrupt: On Ctrl-C (SIGINT, unless in
                ``preemption_signals``), once the save in flight is committed
                (or, if it had not started writing, abandoned); meanwhile
                more Ctrl-Cs are logged and ignored. ``session.workspace``
                then holds the last completed epoch's live arrays, or, where
                the interrupted epoch had consumed them (donated), the newest
                committed epoch restored (one process; see ``Session.partial``).
        """
        self._warned = set()
        self._completed: tuple[int, Workspace] | None = None  # see _settle_workspace
        data.warn_unsaved_iterators(self.job.epoch_group.tasks, self._warned)
        self._progress = Progress(
            self.progress,
            self.history,
            total=self.job.epoch_limit,
            display=jax.process_index() == 0,
        )
        self._writers = MultiWriter(self.writers if jax.process_index() == 0 else ())
        self._store = NoHistory()  # a HistoryFile once the manager holds its locks
        mesh = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        try:
            with mesh:
                return self._train(session)
        except KeyboardInterrupt as err:  # the save in flight is complete: stop the user's code
            logger.debug("train was interrupted here:", exc_info=err)
            raise err.with_traceback(None) from None  # not jaxjob's and Orbax's frames
        finally:
            self._completed = None
            self._progress.close()
            self._store.close()
            self._writers.close()

    def _rebuild_history(self, manager: Manager, epoch: int | None) -> None:
        """Rebuilds ``history`` from the manager's history file, once it holds its locks."""
        nodes = manager.node_names()
        self._store = HistoryFile(manager.db_prefix, nodes, timeout_s=self._timeout_s())
        self.history[:] = self._store.rebuild(epoch)

    def _train(self, session: Session) -> int:
        watch = SignalWatch(self.preemption_signals if self._watching else ())
        with watch:
            epoch, preempted = self._train_epochs(session, watch)
        if not preempted and self._watching:  # a signal after the last epoch's boundary
            preempted = bool(
                any_process(f"the end of epoch {epoch}", watch.requested, self._timeout_s())
            )
        if preempted:
            raise self._failures.preempted(epoch, self.checkpoint_manager, self._timeout_s())
        self._run_final_groups(epoch, session)
        return epoch

    @property
    def _watching(self) -> bool:
        return self.checkpoint_manager is not None and bool(self.preemption_signals)

    def _train_epochs(self, session: Session, watch: SignalWatch) -> tuple[int, bool]:
        """Runs init or resume, then epochs until a stop condition or a preemption."""
        resume, self._life = resume_epoch(
            self.checkpoint_manager, self.resume_from_epoch, self._nodes(), self._timeout_s()
        )
        try:
            epoch, finished = self._start(session, resume)
            self._writers.resume(self.history)
            if not finished:
                checks.check_stop_names(self.job, session)
            if resume is not None:  # from scratch, _start set it at epoch 0's save
                self._clock = SaveClock(self._persistent_clock_epoch(resume, epoch))
            preempted = False
            if not finished and self._watching:
                what = f"the preemption check of epoch {epoch}"
                preempted = bool(any_process(what, watch.requested, self._timeout_s()))
            while not (finished or preempted):
                epoch += 1
                boundary = self._run_epoch(epoch, session, watch)
                finished, preempted = boundary.stop, boundary.preempted
            logger.info("%s at epoch %d", "Preempted" if preempted else "Finished training", epoch)
            self._finish_saves()
        except BaseException as err:
            self._complete_pending_after_error(interrupted=isinstance(err, KeyboardInterrupt))
            if isinstance(err, KeyboardInterrupt):
                self._settle_workspace(session)
            raise
        return epoch, preempted

    def _settle_workspace(self, session: Session) -> None:
        """After Ctrl-C: the session holds a completed epoch's live arrays (see interrupted)."""
        try:
            settle_workspace(session, self._completed, self.checkpoint_manager, self._load)
        except Exception as err:  # noqa: BLE001 (the KeyboardInterrupt goes on; this is logged)
            logger.warning("After the interrupt, restoring the session failed: %s", err)

    def _timeout_s(self) -> float:
        return getattr(self.checkpoint_manager, "timeout_s", hosts.DEFAULT_TIMEOUT_S)

    def _start(self, session: Session, resume: int | None) -> tuple[int, bool]:
        manager = self.checkpoint_manager
        self._local = self._local_schedule(manager)
        if resume is None:
            self.history[:] = []
            session.run(self.job.init_group)
            self._clock = SaveClock(0)  # an auto interval counts from epoch 0's save start
            if manager is not None:
                manager.init(self._nodes(), key_nodes=session.key_nodes)
                set_lineage(manager, self._life, None)
                self._rebuild_history(manager, None)
                self._forget_local(manager, None)
                saving = time.perf_counter()
                self.save_checkpoints(0, session)
                self._saved(time.perf_counter() - saving, provisional=True)
                if not isinstance(self.save_interval, AutoInterval):
                    self._clock = SaveClock(0)  # save_every_seconds: from after that save
            return 0, False
        if manager is None:
            raise ValueError("resume_from_epoch needs a checkpoint_manager to load from")
        manager.init(self._nodes(), retrieve_from_epoch=resume)
        tier, epoch = self._restore(session, manager, resume)
        set_lineage(manager, self._life, epoch)  # the saves of this life record it
        self._rebuild_history(manager, epoch)
        source = manager.tier_manager(tier) if tier == LOCAL else manager
        if self._local is not None:
            self._local = (self._local[0], SaveClock(epoch))
        if self.resume_from_epoch is not None or epoch == 0:
            return epoch, False
        values, _ = self.job.stop_values(session.workspace.set(source.load_outputs(epoch)))
        stopped = any_process(
            f"the stop conditions of epoch {epoch}", any(values), self._timeout_s()
        )
        if stopped:
            _say_finished(self.job, epoch)
        return epoch, bool(stopped)

    def _persistent_clock_epoch(self, persistent: int, resumed: int) -> int:
        """Where the persistent tier's interval counts from after resuming from ``resumed``.

        From its own last save, also after a resume from a newer local
        epoch, so that its epochs stay those of an uninterrupted run: with
        ``save_every_epochs=k``, the last multiple of ``k`` epochs after
        ``persistent`` that ``resumed`` reached (a save started there and was lost).
        """
        every = getattr(self.save_interval, "every_epochs", None)
        if not every:
            return persistent
        return persistent + (resumed - persistent) // every * every

    def _local_schedule(self, manager: Manager | None) -> tuple[SaveInterval, SaveClock] | None:
        tier = getattr(manager, "local_tier", None)
        if tier is None:
            return None
        interval = SaveInterval(every_epochs=tier.every_epochs, every_seconds=tier.every_seconds)
        return interval, SaveClock(0)

    def _forget_local(self, manager: Manager, epoch: int | None) -> None:
        """Drops local epochs newer than ``epoch`` (all on a fresh start): another life's."""
        if self._local is not None:
            manager.forget_local_after(epoch)

    def _restore(self, session: Session, manager: Manager, persistent: int) -> tuple[str, int]:
        """Restores the newest epoch intact on every process, from either tier: ``(tier, epoch)``.

        Without a local tier (or with ``resume_from_epoch``) that is the
        persistent tier's ``persistent``. Otherwise every process lists its
        local tier (one exchange); the newest local epoch newer than
        ``persistent`` that every process holds is restored, and if it does
        not restore on some process (a damaged array), the next older one;
        else ``persistent``. One INFO line says which tier, epoch and why.
        """
        timeout_s = self._timeout_s()
        if self._local is None or self.resume_from_epoch is not None:
            return self._restore_persistent(session, manager, persistent)
        choice = local_choice(manager, persistent, timeout_s)
        local = manager.tier_manager(LOCAL)
        for epoch in choice.epochs:
            failed: Exception | None = None
            try:  # what restore_targets reads before its own exchange, read first
                local.saved_shapes(epoch)
                local.saved_targets(epoch)
            except Exception as err:  # noqa: BLE001 (any reason; every process tries the next)
                failed = err
            what = f"the local epoch {epoch}'s manifest"
            if not any_process(what, failed is not None, timeout_s):
                try:
                    self._load(session, local, epoch)
                except hosts.HostTimeoutError:
                    raise
                except Exception as err:  # noqa: BLE001 (a damaged copy here: try the next)
                    failed = err
            where = any_process(
                f"the restore of local epoch {epoch}", failed is not None, timeout_s
            )
            manager.report_local_stats("checkpoint_load")
            if not where:
                status_logger().info(
                    "Resuming from epoch %d of the local tier (%s): the newest epoch intact on "
                    "every process; the persistent tier's newest is %d%s",
                    epoch, local.db_prefix, persistent,
                    "; passed over: " + "; ".join(choice.why) if choice.why else "",
                )  # fmt: skip
                self._forget_local(manager, epoch)
                return LOCAL, epoch
            choice.why.append(f"local epoch {epoch} did not restore on processes {where}")
            if failed is not None:
                logger.warning("Local epoch %d did not restore here: %s", epoch, failed)
        status_logger().info(
            "Resuming from epoch %d of the persistent tier (%s): %s",
            persistent, manager.db_prefix,
            "; ".join(choice.why) or "no local epoch is newer",
        )  # fmt: skip
        return self._restore_persistent(session, manager, persistent)

    def _restore_persistent(
        self, session: Session, manager: Manager, epoch: int
    ) -> tuple[str, int]:
        """Restores the persistent tier's ``epoch``; drops the local epochs newer than it.

        With ``resume_from_epoch`` too: the branch the user left is never resumed.
        """
        self._load(session, manager, epoch)
        manager.report_checkpoint_stats("checkpoint_load")
        self._forget_local(manager, epoch)
        return PERSISTENT, epoch

    def _load(self, session: Session, source: Manager, epoch: int) -> None:
        targets, self._deferred_shardings = restore_targets(self.job, session, source, epoch)
        placed = {**shardings.as_saved(source, epoch, targets), **targets}  # host tasks' too
        try:
            session.workspace = shardings.movable(source.load(epoch, targets=placed))
        except ProcessCountError as err:
            raise data_count_error(err, self.job, epoch) or err from None
        session.traced_names = set(targets)

    def _run_epoch(self, epoch: int, session: Session, watch: SignalWatch) -> Boundary:
        logger.debug("Starting epoch %d", epoch)
        self._completed = (epoch - 1, session.workspace)  # its arrays, until the epoch donates them
        started = time.perf_counter()
        deferred, self._deferred_shardings = self._deferred_shardings, False
        run = shardings.run_epoch_group(
            session, self.job.epoch_group, deferred=deferred, traced_names=session.traced_names
        )
        self._completed = (epoch, session.workspace)  # holding nothing the session does not
        checks.warn_close_outputs(
            set(run) - set(session.workspace), session.workspace, self._warned
        )
        faults.point("epoch")
        progress = self._progress.values(epoch, run)
        values, read = self.job.stop_values(run)
        boundary = agree_boundary(
            epoch,
            stop=any(values),
            preempted=watch.requested,
            interval=self.save_interval,
            clock=self._clock,
            failures=self._failures,
            manager=self.checkpoint_manager,
            timeout_s=self._timeout_s(),
            local=self._local,
        )
        save_time_s = 0.0
        saved_to = None
        two_tiers = self._local is not None
        if self.checkpoint_manager is not None and (boundary.save or boundary.local):
            tier = PERSISTENT if boundary.save else LOCAL
            self._store.saving(
                {"epoch": epoch, **progress, **({"saved_to": tier} if two_tiers else {})}
            )
            wanted = [*read, *self.checkpoint_manager.required_outputs]
            outputs = {k: run[k] for k in wanted if k in run and k not in session.workspace}
            jax.block_until_ready(run)  # the save's copy would wait for it: not save time
            saving = time.perf_counter()
            if self._local is not None:
                self._local[1].saved(epoch)  # either tier's save restarts the local interval
            if boundary.save:
                self._clock.saved(epoch)
                self.save_checkpoints(epoch, session, outputs=outputs)
                saved_to = PERSISTENT
            else:
                self._save_local(epoch, session, outputs)
                saved_to = LOCAL
            save_time_s = time.perf_counter() - saving
            if boundary.save:
                self._saved(save_time_s)
        epoch_time_s = time.perf_counter() - started
        record = self._progress.epoch_done(
            epoch,
            progress,
            epoch_time_s=epoch_time_s,
            save_time_s=save_time_s,
            saved_to=saved_to if two_tiers else None,
        )
        if isinstance(self.save_interval, AutoInterval):
            record["save_interval_s"] = self.save_interval.seconds
        if saved_to is None:
            self._store.ran(record)
        else:
            self._store.saved(record)
        self._writers.write(record)
        return boundary

    def _saved(self, save_time_s: float, *, provisional: bool = False) -> None:
        """A save took ``save_time_s`` of the training thread: the cost an auto interval uses."""
        if isinstance(self.save_interval, AutoInterval):
            self.save_interval.record(save_time_s, provisional=provisional)

    def _run_final_groups(self, epoch: int, session: Session) -> None:
        if self.upload_task_group_builder is not None:
            group = self.upload_task_group_builder.build(epoch, self.checkpoint_manager)
            session.run(group)
            logger.info("Finished uploading the checkpoints")
        session.run(self.job.download_group)
        session.run(self.job.exit_group)

    def load_blobs_from_checkpoints(self, blob_names: list[str], epoch: int, session: Session):
        """Loads the named leaves of every node's checkpoint of ``epoch`` into the session.

        In a multi-process job call it on every process (it reports every
        process's stats); to read on one process alone, call the manager's
        ``load_blobs_locally``.

        Returns:
            False, without raising, if some node's checkpoint of ``epoch`` is missing.

        Raises:
            ValueError: If the runner has no checkpoint manager.
        """
        manager = self.checkpoint_manager
        if manager is None:
            raise ValueError("load_blobs_from_checkpoints needs a checkpoint_manager")
        result = manager.load_blobs_locally(self._nodes(), blob_names, epoch, session)
        manager.report_checkpoint_stats("checkpoint_partial_load")
        return result

    def save_checkpoints(self, epoch: int, session: Session, *, outputs=None) -> None:
        """Saves the session's persistent workspace as checkpoint ``epoch``.

        A failure follows ``on_save_error``. A failure of the previous
        epoch's background write, or of its metadata record (EIO, ENOSPC on
        the metadata handler's file), surfaces here too. In a multi-process job,
        call it on every process: a failure on any process is seen by all.
        The metadata handler's ``cp_accessible()``, the save and its stats
        report take one exchange with the other processes in all (the save's).

        Raises:
            ValueError: If the runner has no checkpoint manager.
            CheckpointSaveError: Under ``on_save_error="raise"``.
            HostTimeoutError: If another process does not arrive in time
                (whatever the policy: the job cannot go on without it).
            TypeError: For a leaf no save can store (a zero-size array, a
                dtype Orbax lacks), whatever the policy, before anything is
                written.
        """
        manager = self.checkpoint_manager
        if manager is None:
            raise ValueError("save_checkpoints needs a checkpoint_manager")
        try:
            manager.cp_accessible(epoch=None)  # the manager posts the answer with the save
            try:
                manager.save(epoch, session.workspace, outputs=outputs)
            except CheckpointSaveError as err:
                if err.epoch == epoch:
                    raise
                self._on_save_failure(err)
            manager.write_checkpoint_metadata(epoch)
            manager.report_checkpoint_stats("checkpoint_save")
        except (hosts.HostTimeoutError, UnstorableLeafError):
            raise  # the job cannot go on without the other process; no save of it can succeed
        except Exception as err:
            earlier = earlier_failure(err)  # the previous save's, found in the same round
            if earlier is not None:
                self._on_save_failure(earlier)
            if not isinstance(err, CheckpointSaveError) or err.epoch == epoch:
                where = db_name(epoch, self._nodes()[0], manager.db_prefix)
                self._on_save_failure(as_save_error(epoch, where, err))
            else:
                raise
        self._failures.metadata(manager)

    def _save_local(self, epoch: int, session: Session, outputs: dict[str, Any]) -> None:
        """Saves ``epoch`` to this process's local tier; a failure goes to ``on_save_error``.

        In a multi-process job the failure is handled on every process at the
        next epoch boundary (each process writes its own local tier).
        """
        manager = self.checkpoint_manager
        try:
            manager.save_local(epoch, session.workspace, outputs=outputs)
        except (hosts.HostTimeoutError, UnstorableLeafError):
            raise
        except Exception as err:
            where = manager.tier_manager(LOCAL).db_prefix
            earlier = earlier_failure(err)
            found = [earlier] if earlier is not None else []
            self._failures.local([*found, as_save_error(epoch, where, err)], manager)
        self._failures.metadata(manager)  # a persistent epoch's record written meanwhile

    def _on_save_failure(self, err: CheckpointSaveError) -> None:
        self._failures.handle(err, self.checkpoint_manager)

    def _finish_saves(self) -> None:
        if self.checkpoint_manager is not None:
            self._failures.finish(self.checkpoint_manager, self._timeout_s())

    def _complete_pending_after_error(self, *, interrupted: bool = False) -> None:
        """Completes this process's saves in flight, without waiting on other processes."""
        if self.checkpoint_manager is not None:
            self._failures.complete_pending(self.checkpoint_manager, interrupted=interrupted)


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
