"""The job runner: the seed's epoch-level training flow with checkpoints.

One ``train``: the start (:mod:`jaxjob._src.run.resume`: from scratch, or
restored from a checkpoint), then epochs, each ending with one agreement of
every process and, when due, a save (:mod:`jaxjob._src.run.saving`), then the
final groups. A runner without a checkpoint manager drives a
:class:`jaxjob._src.run.protocol.NullManager`: no tiers, so nothing is saved.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Sequence
from typing import Any, Literal

import jax

from jaxjob._src.base import faults
from jaxjob._src.base.errors import CheckpointSaveError
from jaxjob._src.base.log import get_logger
from jaxjob._src.base.preemption import SignalWatch, check_signals
from jaxjob._src.core import checks, data
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Session
from jaxjob._src.core.task import DEFAULT_NODE
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.run import shardings
from jaxjob._src.run.agreement import Boundary, any_process
from jaxjob._src.run.auto_interval import AutoInterval, save_policy
from jaxjob._src.run.epoch_records import EpochRecords
from jaxjob._src.run.interrupted import settle_workspace
from jaxjob._src.run.progress import check_names
from jaxjob._src.run.protocol import Manager, NullManager
from jaxjob._src.run.resume import Resume, check_resume_from
from jaxjob._src.run.save_failures import SaveFailures
from jaxjob._src.run.saving import Saving
from jaxjob._src.run.upload import UploadTaskGroupBuilder
from jaxjob._src.run.writers import MetricWriter, check_writers

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
        self.save_errors: list[CheckpointSaveError] = []
        self._failures = SaveFailures(
            on_save_error, self.save_errors, lambda epoch: self._records.progress.save_failed(epoch)
        )
        self.resume_from_epoch = check_resume_from(resume_from_epoch)
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
        self.job = job
        self.checkpoint_manager = checkpoint_manager
        self._manager: Manager = NullManager() if checkpoint_manager is None else checkpoint_manager
        self.upload_task_group_builder = upload_task_group_builder
        self.progress = check_names(progress)
        self.mesh = mesh
        self.history: list[dict[str, Any]] = []
        self._records = EpochRecords(self.history)
        self.writers = check_writers(writers)
        self._warned: set[str] = set()
        self.save_interval = save_policy(
            save_every, mtbf_hours, save_every_epochs, save_every_seconds
        )
        self.preemption_signals = check_signals(preemption_signals)
        self._saving = Saving(self._manager, self._failures, self.save_interval, self._nodes)
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

    def _timeout_s(self) -> float:
        return self._manager.options.timeout_s

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
        self._records = EpochRecords(
            self.history, self.progress, self.writers, self.job.epoch_limit
        )
        mesh = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        try:
            with mesh:
                return self._train(session)
        except KeyboardInterrupt as err:  # the save in flight is complete: stop the user's code
            logger.debug("train was interrupted here:", exc_info=err)
            raise err.with_traceback(None) from None  # not jaxjob's and Orbax's frames
        finally:
            self._completed = None
            self._records.close()

    def _train(self, session: Session) -> int:
        watching = bool(self._saving.tiers and self.preemption_signals)  # a preemption saves
        with SignalWatch(self.preemption_signals if watching else ()) as watch:
            epoch, preempted = self._train_epochs(session, watch, watching)
        if not preempted and watching:  # a signal after the last epoch's boundary
            preempted = bool(
                any_process(f"the end of epoch {epoch}", watch.requested, self._timeout_s())
            )
        if preempted:
            raise self._saving.preempted(epoch, self._timeout_s())
        self._run_final_groups(epoch, session)
        return epoch

    def _train_epochs(
        self, session: Session, watch: SignalWatch, watching: bool
    ) -> tuple[int, bool]:
        """Runs init or resume, then epochs until a stop condition or a preemption."""
        resume = Resume(
            self.job, self._manager, self.resume_from_epoch, self._nodes(), self._timeout_s()
        )
        try:
            epoch, finished = self._start(session, resume)
            self._records.resumed()
            if not finished:
                checks.check_stop_names(self.job, session)
            if resume.epoch is not None:  # from scratch, the save of epoch 0 set it
                self._saving.resumed(resume.epoch, epoch)
            preempted = False
            if not finished and watching:
                what = f"the preemption check of epoch {epoch}"
                preempted = bool(any_process(what, watch.requested, self._timeout_s()))
            while not (finished or preempted):
                epoch += 1
                boundary = self._run_epoch(epoch, session, watch)
                finished, preempted = boundary.stop, boundary.preempted
            logger.info("%s at epoch %d", "Preempted" if preempted else "Finished training", epoch)
            self._finish_saves()
        except BaseException as err:
            interrupted = isinstance(err, KeyboardInterrupt)
            self._saving.complete_pending(interrupted=interrupted)
            if interrupted:
                self._settle_workspace(session, resume)
            raise
        return epoch, preempted

    def _start(self, session: Session, resume: Resume) -> tuple[int, bool]:
        """From scratch: the init group, epoch 0 saved; else the restore: ``(epoch, finished)``."""
        self._saving.begin()
        if resume.epoch is None:
            self.history[:] = []
            session.run(self.job.init_group)
            self._saving.restart()
            resume.from_scratch(session)
            self._records.rebuild(self._manager, None, self._timeout_s())
            self._saving.first(session)
            return 0, False
        tier, epoch = resume.restore(session)
        self._deferred_shardings = resume.deferred
        self._records.rebuild(self._manager, epoch, self._timeout_s())
        self._saving.resumed_local(epoch)
        return epoch, resume.finished(session, tier, epoch)

    def _settle_workspace(self, session: Session, resume: Resume) -> None:
        """After Ctrl-C: the session holds a completed epoch's live arrays (see interrupted)."""
        try:
            settle_workspace(session, self._completed, self._manager, resume.load)
        except Exception as err:  # noqa: BLE001 (the KeyboardInterrupt goes on; this is logged)
            logger.warning("After the interrupt, restoring the session failed: %s", err)

    def _run_epoch(self, epoch: int, session: Session, watch: SignalWatch) -> Boundary:
        logger.debug("Starting epoch %d", epoch)
        started = time.perf_counter()
        run = self._run_group(epoch, session)
        faults.point("epoch")
        progress = self._records.progress.values(epoch, run)
        values, read = self.job.stop_values(run)
        boundary = self._saving.boundary(
            epoch, stop=any(values), preempted=watch.requested, timeout_s=self._timeout_s()
        )
        saved_to, save_time_s = self._saving.save_epoch(
            epoch, session, boundary, run, read=read, record={"epoch": epoch, **progress},
            store=self._records.store,
        )  # fmt: skip
        self._records.done(
            epoch, progress, epoch_time_s=time.perf_counter() - started, save_time_s=save_time_s,
            saved_to=saved_to, two_tiers=self._saving.local is not None,
            interval=self.save_interval,
        )  # fmt: skip
        return boundary

    def _run_group(self, epoch: int, session: Session) -> dict[str, Any]:
        """Runs the epoch group on ``session``: its outputs (the session holds its state)."""
        self._completed = (epoch - 1, session.workspace)  # its arrays, until the epoch donates them
        deferred, self._deferred_shardings = self._deferred_shardings, False
        run = shardings.run_epoch_group(
            session, self.job.epoch_group, deferred=deferred, traced_names=session.traced_names
        )
        self._completed = (epoch, session.workspace)  # holding nothing the session does not
        checks.warn_close_outputs(
            set(run) - set(session.workspace), session.workspace, self._warned
        )
        return run

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
        result = self._manager.load_blobs_locally(self._nodes(), blob_names, epoch, session)
        self._manager.report_checkpoint_stats("checkpoint_partial_load")
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
        self._saving.save_checkpoints(epoch, session, outputs=outputs)

    def _finish_saves(self) -> None:
        """Waits for the saves in flight (the end of ``train``); failures go to the policy."""
        self._saving.finish(self._timeout_s())
