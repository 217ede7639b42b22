"""The job runner: the seed's epoch-level training flow with checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Sequence
from typing import Any, Literal

import jax

from jaxjob._src.base import faults
from jaxjob._src.base.errors import CheckpointSaveError, Preempted
from jaxjob._src.base.log import get_logger
from jaxjob._src.base.preemption import HeldSignal, SignalWatch, check_signals
from jaxjob._src.checkpoint.codec import UnstorableLeafError
from jaxjob._src.checkpoint.layout import db_name
from jaxjob._src.core import checks
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Program, Session
from jaxjob._src.core.task import DEFAULT_NODE
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager.shared import Manager
from jaxjob._src.multihost import hosts
from jaxjob._src.run.interval import SaveClock, SaveInterval
from jaxjob._src.run.progress import Progress, check_names
from jaxjob._src.run.upload import UploadTaskGroupBuilder

__all__ = ["JobRunner"]

logger = get_logger(__name__)
SAVE_ERROR_POLICIES = ("warn", "raise")


@dataclasses.dataclass(frozen=True)
class _Boundary:
    """What every process agreed at the end of an epoch."""

    stop: bool
    preempted: bool
    save: bool


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
        mesh: A ``jax.sharding.Mesh`` that ``train`` enters with
            ``jax.set_mesh`` (needed for meshes with Explicit axes, the
            default of ``jax.make_mesh``: tasks then use
            ``jax.sharding.reshard(x, P(...))``).

    Attributes:
        history: One dict per epoch that ``train`` ran on this runner:
            ``"epoch"``, the ``progress`` names' values (floats),
            ``"epoch_time_s"`` (the epoch group and its save) and
            ``"save_time_s"`` (the part the training thread spent saving),
            and, after a save failure surfaced during that epoch's save,
            ``"save_failed"`` (the failed epochs; the progress line shows
            ``save FAILED``).
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
        >>> jaxjob.JobRunner(job, ckpt).train(jaxjob.Session())  # finished: runs no epoch
        3
    """

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
        preemption_signals: Sequence[signal.Signals | int] = (signal.SIGTERM,),
    ) -> None:
        if on_save_error not in SAVE_ERROR_POLICIES:
            raise ValueError(
                f"on_save_error must be one of {SAVE_ERROR_POLICIES}, got {on_save_error!r}"
            )
        if resume_from_epoch is not None and (
            isinstance(resume_from_epoch, bool)
            or not isinstance(resume_from_epoch, int)
            or resume_from_epoch < 0
        ):
            raise ValueError(
                f"resume_from_epoch must be None or an int >= 0, got {resume_from_epoch!r}"
            )
        self.job = job
        self.checkpoint_manager = checkpoint_manager
        self.resume_from_epoch = resume_from_epoch
        self.upload_task_group_builder = upload_task_group_builder
        self.on_save_error = on_save_error
        self.save_errors: list[CheckpointSaveError] = []
        # metadata records that failed here, to share at the next exchange (multi-process)
        self._unshared_metadata: list[CheckpointSaveError] = []
        self.progress = check_names(progress)
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
        self.mesh = mesh
        self.history: list[dict[str, Any]] = []
        self._progress = Progress(None, self.history)
        self._warned: set[str] = set()
        self.save_interval = SaveInterval(
            every_epochs=save_every_epochs, every_seconds=save_every_seconds
        )
        self.preemption_signals = check_signals(preemption_signals)
        self._clock = SaveClock()
        self._deferred_shardings = False

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
                more Ctrl-Cs are logged and ignored.
        """
        self._warned = set()
        self._progress = Progress(
            self.progress,
            self.history,
            total=self.job.epoch_limit,
            display=jax.process_index() == 0,
        )
        mesh = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        try:
            with mesh:
                return self._train(session)
        except KeyboardInterrupt as err:  # the save in flight is complete: stop the user's code
            logger.debug("train was interrupted here:", exc_info=err)
            raise err.with_traceback(None) from None  # not jaxjob's and Orbax's frames
        finally:
            self._progress.close()

    def _train(self, session: Session) -> int:
        watch = SignalWatch(self.preemption_signals if self._watching else ())
        with watch:
            epoch, preempted = self._train_epochs(session, watch)
        if not preempted and self._watching:  # a signal after the last epoch's boundary
            preempted = bool(self._any_process(f"the end of epoch {epoch}", watch.requested))
        if preempted:
            raise self._preempted(epoch)
        self._run_final_groups(epoch, session)
        return epoch

    @property
    def _watching(self) -> bool:
        return self.checkpoint_manager is not None and bool(self.preemption_signals)

    def _resume_epoch(self) -> int | None:
        manager = self.checkpoint_manager
        if manager is None:
            return self.resume_from_epoch
        manager.set_params(nodes=self._nodes())
        resume = hosts.decide(
            "the resume epoch",
            lambda: manager.get_resume_from_epoch_id(self.resume_from_epoch),
            timeout_s=self._timeout_s(),
        )
        if resume is not None:
            logger.info("Resuming from epoch %d", resume)
        return resume

    def _train_epochs(self, session: Session, watch: SignalWatch) -> tuple[int, bool]:
        """Runs init or resume, then epochs until a stop condition or a preemption."""
        resume = self._resume_epoch()
        try:
            epoch, finished = self._start(session, resume)
            if not finished:
                self._check_stop_names(session)
            self._clock = SaveClock(epoch)
            preempted = False
            if not finished and self._watching:
                what = f"the preemption check of epoch {epoch}"
                preempted = bool(self._any_process(what, watch.requested))
            while not (finished or preempted):
                epoch += 1
                boundary = self._run_epoch(epoch, session, watch)
                finished, preempted = boundary.stop, boundary.preempted
            logger.info("%s at epoch %d", "Preempted" if preempted else "Finished training", epoch)
            self._finish_saves()
        except BaseException as err:
            self._complete_pending_after_error(interrupted=isinstance(err, KeyboardInterrupt))
            raise
        return epoch, preempted

    def _preempted(self, epoch: int) -> Preempted:
        """The exception for a preemption after ``epoch``: the newest committed epoch's."""
        if any(err.epoch == epoch for err in self.save_errors):
            manager = self.checkpoint_manager
            committed = hosts.decide(
                "the newest committed epoch",
                manager.committed_epochs,
                timeout_s=self._timeout_s(),
            )
            if not committed:
                raise self.save_errors[-1]
            logger.warning("The save of epoch %d failed; %d is committed", epoch, committed[-1])
            epoch = committed[-1]
        return Preempted(epoch)

    def _timeout_s(self) -> float:
        return getattr(self.checkpoint_manager, "timeout_s", hosts.DEFAULT_TIMEOUT_S)

    def _any_process(self, what: str, flag: bool) -> list[int]:
        """The processes where ``flag`` holds (every process calls this)."""
        posts = hosts.exchange(what, {"flag": bool(flag)}, timeout_s=self._timeout_s())
        return [p for p, post in enumerate(posts) if post["flag"]]

    def _start(self, session: Session, resume: int | None) -> tuple[int, bool]:
        manager = self.checkpoint_manager
        if resume is None:
            session.run(self.job.init_group)
            if manager is not None:
                manager.init(self._nodes(), key_nodes=session.key_nodes)
                self.save_checkpoints(0, session)
            return 0, False
        if manager is None:
            raise ValueError("resume_from_epoch needs a checkpoint_manager to load from")
        manager.init(self._nodes(), retrieve_from_epoch=resume)
        targets = self._restore_targets(session, manager, resume)
        session.workspace = manager.load(resume, targets=targets)
        session.traced_names = set(targets)
        manager.report_checkpoint_stats("checkpoint_load")
        if self.resume_from_epoch is not None or resume == 0:
            return resume, False
        values, _ = self.job.stop_values(session.workspace.set(manager.load_outputs(resume)))
        stopped = self._any_process(f"the stop conditions of epoch {resume}", any(values))
        if stopped:
            logger.info("The checkpoint of epoch %d meets a stop condition: finished", resume)
        return resume, bool(stopped)

    def _check_stop_names(self, session: Session) -> None:
        """Raises, before the first epoch, for a stop condition naming nothing the epoch can read.

        The names are the workspace's and those the epoch group's jitted
        program sets (traced abstractly, as its first run would). A host task
        may set any name: with one in the epoch group, only the run can tell.
        """
        names = [c for c in self.job.stop_conditions if isinstance(c, str)]
        missing = [n for n in names if n not in session.workspace]
        steps = session.steps(self.job.epoch_group)
        if not missing or not all(isinstance(step, Program) for step in steps):
            return
        produced = set().union(*(step.set_names(session.workspace) for step in steps))
        missing = [n for n in missing if n not in produced]
        if missing:
            raise KeyError(
                f"stop conditions {missing} name no workspace leaf and no output of the epoch "
                f"group; the workspace holds {sorted(session.workspace)} and the epoch group "
                f"sets {sorted(produced)}: name one of those or pass a callable ws -> bool"
            )

    def _restore_targets(self, session: Session, manager: Manager, epoch: int) -> dict[str, Any]:
        """Traces the init group abstractly; host steps contribute the saved shapes.

        Raises:
            ValueError: If the checkpoint holds other names than the init group sets.
        """
        saved = manager.saved_shapes(epoch)
        abstract: dict[str, Any] = {}
        targets: dict[str, Any] = {}
        nodes: dict[str, str] = {}
        steps = session.steps(self.job.init_group)
        for step in steps:
            if isinstance(step, Program):
                produced = step.abstract(abstract)
                targets.update(produced)
                abstract.update(produced)
                nodes.update(step.producers)
            else:
                abstract.update({k: v for k, v in saved.items() if k not in abstract})
        loaded = _loaded_nodes(manager)
        checks.check_resume_names(
            [k for k in targets if loaded is None or nodes.get(k) in loaded],
            saved,
            exact=all(isinstance(step, Program) for step in steps),
            epoch=epoch,
            where=manager.db_prefix,
        )
        targets = {k: v for k, v in targets.items() if k in saved}
        return self._epoch_shardings(session, epoch, abstract, targets)

    def _epoch_shardings(
        self, session: Session, epoch: int, abstract: dict[str, Any], targets: dict[str, Any]
    ) -> dict[str, Any]:
        """The targets with the shardings the epochs leave (the epoch group traced abstractly).

        After epoch ``k >= 1`` the state has the shardings of the epoch group's
        outputs, which may differ from those init gave it. Tracing the epoch
        group from init's (until the shardings stop changing) gives them without
        running anything; the next epoch's compilation is the same one. What
        host steps set keeps the shardings it has (they cannot be traced).

        A jitted task that reads what a host task of the epoch group returns
        (a data loader's batch) cannot be traced before the load: the host
        task's outputs are epoch outputs, not in the checkpoint, and it needs
        the restored values (a cursor) to run. Such a job restores with init's
        shardings and the epoch group is traced in the first epoch, right
        before the first jitted program, with what the host tasks returned in
        that epoch's own run (see :meth:`_run_epoch_group`): the host task
        runs once, as in an uninterrupted run, and its outputs are the ones
        that epoch's programs compile with.
        """
        self._deferred_shardings = False
        if epoch == 0:
            return targets
        traced = _traced_shardings(session.steps(self.job.epoch_group), abstract, targets)
        if traced is None:
            logger.debug(
                "The epoch group reads host task outputs: its shardings are traced in its next run"
            )
            self._deferred_shardings = True
            return targets
        return traced

    def _run_epoch_group(self, session: Session) -> Workspace:
        """Runs the epoch group; in the first epoch after such a resume, reshards its state first.

        Its host tasks must keep the types of the traced persistent leaves
        (``Session.run``'s ``keep_traced``): what they return is saved.

        With a host task feeding the epoch group's jitted tasks, the state was
        restored with init's shardings (:meth:`_epoch_shardings`). Before the
        first jitted program whose inputs are all known, the epoch group is
        traced on the epoch's workspace (the host outputs included) until the
        shardings stop changing, and the state leaves not yet rewritten in
        this epoch are moved to the traced shardings (a copy, bitwise; on one
        device nothing moves), as the previous epoch would have left them.
        """
        group = self.job.epoch_group
        if not self._deferred_shardings:
            return session.run(group, keep_traced=True)
        start = session.workspace
        names = [n for n in start if n in session.traced_names]
        steps = session.steps(group)

        def reshard(ws: Workspace) -> Workspace:
            if not self._deferred_shardings:
                return ws
            abstract = {k: v for k, v in ws.items() if k not in start}
            traced = _traced_shardings(steps, {**start, **abstract}, {n: start[n] for n in names})
            if traced is None:
                return ws  # a later host step's outputs are missing: try at the next program
            self._deferred_shardings = False
            kept = [n for n in names if ws[n] is start[n]]
            return ws.set({n: jax.tree.map(_moved, ws[n], traced[n]) for n in kept})

        try:
            return session.run(group, before_program=reshard, keep_traced=True)
        finally:
            self._deferred_shardings = False

    def _run_epoch(self, epoch: int, session: Session, watch: SignalWatch) -> _Boundary:
        logger.debug("Starting epoch %d", epoch)
        started = time.perf_counter()
        run = self._run_epoch_group(session)
        checks.warn_close_outputs(
            set(run) - set(session.workspace), session.workspace, self._warned
        )
        faults.point("epoch")
        values, read = self.job.stop_values(run)
        boundary = self._agree_boundary(epoch, any(values), watch.requested)
        save_time_s = 0.0
        if self.checkpoint_manager is not None and boundary.save:
            wanted = [*read, *self.checkpoint_manager.required_outputs]
            outputs = {k: run[k] for k in wanted if k in run and k not in session.workspace}
            jax.block_until_ready(run)  # the save's copy would wait for it: not save time
            saving = time.perf_counter()
            self._clock.saved(epoch)
            self.save_checkpoints(epoch, session, outputs=outputs)
            save_time_s = time.perf_counter() - saving
        epoch_time_s = time.perf_counter() - started
        self._progress.epoch_done(epoch, run, epoch_time_s=epoch_time_s, save_time_s=save_time_s)
        return boundary

    def _agree_boundary(self, epoch: int, stop: bool, preempted: bool) -> _Boundary:
        """One exchange per epoch: stop conditions, preemption signals, process 0's clock."""
        due_by_time = self.save_interval.due_by_time(self._clock.seconds_since())
        posts = hosts.exchange(
            f"the stop conditions of epoch {epoch}",
            {
                "flag": bool(stop),
                "preempted": bool(preempted),
                "due_by_time": due_by_time,
                "metadata": self._take_unshared_metadata(),
            },
            timeout_s=self._timeout_s(),
        )
        self._shared_metadata_failures(posts)
        signalled = [p for p, post in enumerate(posts) if post["preempted"]]
        if signalled and not preempted:
            logger.warning("Processes %s were preempted: stopping after epoch %d", signalled, epoch)
        stop, preempted = any(p["flag"] for p in posts), bool(signalled)
        due = posts[0]["due_by_time"] or self.save_interval.due_by_epochs(epoch - self._clock.epoch)
        return _Boundary(stop=stop, preempted=preempted, save=stop or preempted or due)

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
            if not isinstance(err, CheckpointSaveError) or err.epoch == epoch:
                where = db_name(epoch, self._nodes()[0], manager.db_prefix)
                self._on_save_failure(_as_save_error(epoch, where, err))
            else:
                raise
        self._metadata_failures()

    def _metadata_failures(self) -> None:
        """Hands each metadata record that failed (EIO, ENOSPC, ...) to ``on_save_error``.

        In a multi-process job only process 0 writes the metadata file: its
        failures ride on the next epoch's boundary exchange (or, after the
        last epoch, on one exchange of their own) so that every process
        handles the same :class:`CheckpointSaveError` at the same point.
        """
        failures = self.checkpoint_manager.take_metadata_failures()
        if jax.process_count() > 1:
            self._unshared_metadata += failures
            return
        for err in failures:
            self._on_save_failure(err)

    def _take_unshared_metadata(self) -> list[list[Any]]:
        """This process's failed metadata records as posted: ``[epoch, path, "Type: message"]``."""
        unshared, self._unshared_metadata = self._unshared_metadata, []
        return [[e.epoch, e.db_name, _cause_text(e)] for e in unshared]

    def _shared_metadata_failures(self, posts: Sequence[dict[str, Any]]) -> None:
        """Hands the failed metadata records of every process's post to ``on_save_error``."""
        for process, post in enumerate(posts):
            for epoch, where, text in post.get("metadata", []):
                failure = CheckpointSaveError(epoch, where, text, [process])
                self._on_save_failure(failure)

    def _share_last_metadata(self) -> None:
        """After the last save: one exchange of the metadata records failed since the boundary."""
        if jax.process_count() == 1:
            return
        posts = hosts.exchange(
            "the metadata records of the last saves",
            {"metadata": self._take_unshared_metadata()},
            timeout_s=self._timeout_s(),
        )
        self._shared_metadata_failures(posts)

    def _on_save_failure(self, err: CheckpointSaveError) -> None:
        self.save_errors.append(err)
        self._progress.save_failed(err.epoch)
        stats = {err.db_name: {"epoch": err.epoch, "error": _cause_text(err)}}
        self.checkpoint_manager.metadata_handler.report("checkpoint_save", stats)
        if self.on_save_error == "raise":
            raise err
        logger.warning("Unable to write checkpoint for epoch %d: %s", err.epoch, _one_line(err))
        logger.debug("The failure of the save of epoch %d:", err.epoch, exc_info=err)

    def _finish_saves(self) -> None:
        if self.checkpoint_manager is None:
            return
        try:
            self.checkpoint_manager.wait_until_finished()
        except CheckpointSaveError as err:
            self._on_save_failure(err)
        self._metadata_failures()
        self._share_last_metadata()

    def _complete_pending_after_error(self, *, interrupted: bool = False) -> None:
        """Completes this process's saves in flight, without waiting on other processes.

        Meanwhile SIGINT is logged and ignored: a second Ctrl-C must not tear the save.
        """
        manager = self.checkpoint_manager
        if manager is None:
            return
        if interrupted:
            logger.warning(
                "Interrupted (KeyboardInterrupt): %s",
                "completing the save in flight before stopping"
                if manager.has_pending()
                else "no save was in flight; stopping",
            )
        with HeldSignal(signal.SIGINT, "the save in flight"):
            failures = manager.finish_local()
        for err in failures:
            self.save_errors.append(err)
            logger.error("While handling an error, a pending save failed too: %s", _one_line(err))
            logger.debug("The failure of the save of epoch %d:", err.epoch, exc_info=err)


def _shardings(tree: Any) -> list[Any]:
    return [getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(tree)]


def _traced_shardings(
    steps: Sequence[Any], abstract: dict[str, Any], targets: dict[str, Any]
) -> dict[str, Any] | None:
    """``targets`` with the shardings the jitted ``steps`` leave them at their fixed point.

    Returns:
        None if a jitted step reads a name that ``abstract`` lacks and a host
        step of ``steps`` (whose outputs cannot be traced) may set.

    Raises:
        KeyError: If a jitted step reads a missing name and no host step precedes it.
    """
    programs = [s for s in steps if isinstance(s, Program)]
    if not programs:
        return targets
    for _ in range(3):  # a fixed point is reached after one epoch in practice
        ws = {**abstract, **targets}
        host_before = False
        for step in steps:
            if not isinstance(step, Program):
                host_before = True
                continue
            try:
                ws.update(step.abstract(ws))
            except KeyError:
                if host_before:
                    return None
                raise
        traced = {k: ws[k] for k in targets if k in ws}
        if _shardings(traced) == _shardings({k: targets[k] for k in traced}):
            break
        targets = {**targets, **traced}
    return targets


def _moved(leaf: Any, target: Any) -> Any:
    """``leaf`` on ``target`` 's sharding (the same array if it is there already)."""
    sharding = getattr(target, "sharding", None)
    if not isinstance(leaf, jax.Array) or sharding is None or leaf.sharding == sharding:
        return leaf
    return jax.device_put(leaf, sharding)


def _loaded_nodes(manager: Manager) -> set[str] | None:
    """The nodes whose checkpoints this process resumes from; None: every node."""
    managers = manager.node_managers
    if len(managers) == 1:
        return None
    me = jax.process_index()
    return {name for name, m in managers if getattr(m, "owner_process", None) in (None, me)}


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line: its first line, then how many more there are."""
    lines = str(err).strip().splitlines() or [type(err).__name__]
    more = f" (and {len(lines) - 1} more lines, logged at DEBUG)" if len(lines) > 1 else ""
    return lines[0] + more


def _as_save_error(epoch: int, where: str, err: BaseException) -> CheckpointSaveError:
    if isinstance(err, CheckpointSaveError):
        return err
    failure = CheckpointSaveError(epoch, where, err)
    failure.__cause__ = err
    return failure


def _cause_text(err: CheckpointSaveError) -> str:
    """``"Type: message"`` of what made the save fail."""
    cause = err.__cause__ or err
    return f"{type(cause).__name__}: {cause}"
