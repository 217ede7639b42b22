"""The node save engine: one class writes one node's checkpoints, waiting on no other process.

A save of one node is three steps on each process: :meth:`NodeWriter.prepare`
(finish the save in flight, build the manifest, encode the leaves, move a
committed checkpoint of the epoch aside; a problem is posted, not raised),
:meth:`NodeWriter.conclude` (read every process's post: the previous save's
failure anywhere, this save's problem anywhere) and :meth:`NodeWriter.start`
(start the Orbax save, or give it up and put the old checkpoint back).
Between the last two the processes exchange their posts: that is
:func:`jaxjob._src.manager.save.save_round.save_round`, which runs one round over
any number of writers with one exchange. :meth:`NodeWriter.finish` completes
the save in flight. Failures are recorded in :attr:`NodeWriter.failures`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base import memory, preemption
from jaxjob._src.base.errors import CheckpointSaveError, as_save_error, with_earlier
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import manifest, manifest_cache, run_identity, storage
from jaxjob._src.checkpoint.io import CheckpointIO
from jaxjob._src.checkpoint.layout import check_epoch, db_name, is_committed
from jaxjob._src.core.workspace import Workspace, check_names
from jaxjob._src.manager import lock, retention
from jaxjob._src.manager.orbax_log import saving
from jaxjob._src.manager.reader import NodeReader
from jaxjob._src.manager.records import (
    Action,
    SavePost,
    Stats,
)
from jaxjob._src.manager.save import background_start, boundary
from jaxjob._src.manager.save.save_plan import Pending, SavePlan, post_plan, prepare_prefix
from jaxjob._src.manager.save.supersede import (
    deleting_process,
    move_aside,
    put_back,
    remove_superseded,
)
from jaxjob._src.manager.shared import CheckpointOptions

__all__ = ["NodeWriter", "SavePlan"]

logger = get_logger(__name__)


class NodeWriter:
    """Writes one node's checkpoints under ``db_prefix``: its reader, lock and failures.

    Args:
        db_prefix: The normalized checkpoint directory.
        node_name: The node.
        options: The manager's options.
        owner_process: The process that alone saves this node, or None (every process, SPMD).
        required_outputs: The outputs whose values the manifest records (for ``keep``).
        committed: Lists the committed epochs, for error messages.
        on_failure: Called with the epoch of a save in flight that failed.
    """

    def __init__(
        self,
        db_prefix: str,
        node_name: str,
        options: CheckpointOptions,
        *,
        owner_process: int | None,
        required_outputs: Sequence[str] = (),
        committed: Callable[[], list[int]] | None = None,
        on_failure: Callable[[int], None] | None = None,
    ) -> None:
        self.db_prefix = db_prefix
        self.node_name = node_name
        self.options = options
        self.owner_process = owner_process
        self.private = owner_process is not None
        self.required_outputs = tuple(required_outputs)
        self.reader = NodeReader(
            db_prefix,
            node_name,
            codec=storage.codec_for(self.private),
            host_map=options.host_map,
            max_host_bytes=options.max_host_bytes,
            committed=committed or (lambda: []),
        )
        self.failures: list[CheckpointSaveError] = []
        self._on_failure = on_failure or (lambda epoch: None)
        self.last: tuple[str, Stats] | None = None  # this node's last save action
        self._io: CheckpointIO | None = None  # made by the first save (see io)
        self._pending: Pending | None = None
        self._lock: lock.Handle | None = None
        self._failed = retention.FailedSaves()
        # the run id its manifests record: the db_prefix's, read (or created) by the first save,
        # unless set before (a local tier's copies record the persistent tier's run)
        self.run: str | None = None
        self._tier = "persistent"
        self.lineage: tuple[str | None, int | None] = (None, None)  # (life, resumed_from)
        self._manifests = manifest_cache.ManifestCache()  # the last structure's layout

    @property
    def deletes(self) -> bool:
        """Whether this process removes what this node's saves leave (the owner, or process 0)."""
        return jax.process_index() == deleting_process([self.owner_process])

    @property
    def own(self) -> bool:
        """Whether this process saves this node (every process, or the owner)."""
        return self.owner_process in (None, jax.process_index())

    def has_pending(self) -> bool:
        """Whether a save of this process is in flight."""
        return self._pending is not None

    def pending_started(self) -> float | None:
        """When the save in flight started (``time.perf_counter``), or None."""
        return self._pending.started if self._pending else None

    def pending_epoch(self) -> int | None:
        """The epoch of the save in flight, or None."""
        return self._pending.epoch if self._pending else None

    def pending_path(self) -> str | None:
        """The checkpoint directory of the save in flight, or None."""
        return self._pending.db if self._pending else None

    def wait_s(self, started: float | None) -> float:
        """``timeout_s`` plus what remains of the write started at ``started`` (others await it)."""
        if started is None:
            return self.options.timeout_s
        remaining = started + self.options.write_timeout_s - time.perf_counter()
        return self.options.timeout_s + max(0.0, remaining)

    def take_lock(self) -> Exception | None:
        """Takes the node's lock once, then removes what killed saves left.

        Returns:
            The error making ``db_prefix`` unwritable (not holding the lock),
            or the lock lost to another writer, if so.

        Raises:
            CheckpointInUseError: If another live process writes this node here.
        """
        if self._lock is not None:
            return self._lock.lost()
        try:
            if self.private or jax.process_count() == 1:  # else process 0 creates it
                prepare_prefix(self.db_prefix)
            self._lock = lock.acquire(
                self.db_prefix,
                self.node_name,
                owner_process=self.owner_process,
                timeout_s=self.options.timeout_s,
            )
        except OSError as err:
            return err
        if self.deletes:
            retention.sweep(self.db_prefix, self.node_name)
        return None

    def prepare(
        self,
        epoch: int,
        workspace: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        *,
        accessible: bool = True,
    ) -> SavePlan:
        """This process's part of a save before the processes agree; waits on no other.

        ``accessible=False`` (the metadata handler's answer) posts a
        PermissionError and touches nothing. A problem is not raised but
        posted in ``plan.post``.

        Raises:
            TypeError, ValueError: For a bad ``epoch`` or leaf name (on every process alike).
            CheckpointInUseError: If another live process writes this node here.
        """
        epoch = check_epoch(epoch)
        check_names(workspace, "workspace")  # before the lock: nothing is written
        check_names(outputs or {}, "outputs")
        for name in [*workspace, *(outputs or {})]:
            manifest.check_name(name)
        self.check_process()
        path = db_name(epoch, self.node_name, self.db_prefix)
        if not accessible:  # the metadata handler's verdict: touch nothing, finish nothing
            denied = PermissionError(
                f"the metadata handler reports the checkpoints under {self.db_prefix!r} as "
                "not accessible (cp_accessible() is False); nothing was written"
            )
            pending = Pending(epoch, path, time.perf_counter())
            plan = SavePlan(epoch, path, pending, self.options.timeout_s, problem=denied)
            return post_plan(plan)
        unwritable = self.take_lock()
        started = self.pending_started()
        previous = self.finish()
        pending = Pending(epoch, path, time.perf_counter())
        plan = SavePlan(epoch, path, pending, self.wait_s(started), previous=previous)
        try:
            if unwritable is not None:
                raise unwritable
            self._encode(plan, workspace, outputs or {})
        except Exception as err:
            plan.problem = err
        return post_plan(plan)

    def check_process(self) -> None:
        """Raises ValueError if this process may not save this private node."""
        if self.private and jax.process_index() != self.owner_process:
            raise ValueError(
                f"node {self.node_name!r} is saved by process {self.owner_process} alone "
                f"(owner_process), but save was called on process {jax.process_index()}"
            )

    def _encode(self, plan: SavePlan, workspace: Mapping[str, Any], outputs: Mapping) -> None:
        """Builds the manifest and the leaves as stored, then moves the path aside."""
        self.run = self.run or run_identity.ensure(self.db_prefix)
        layout, flat = self._manifests.describe(Workspace(workspace), Workspace(outputs))
        found = manifest.assemble(
            layout, plan.epoch, self.node_name, self.owner_process, run=self.run,
            tier=self.tier, life=self.lineage[0], resumed_from=self.lineage[1],
        )  # fmt: skip
        metrics = retention.metrics_of(self.required_outputs, outputs, workspace)
        plan.found = dataclasses.replace(found, metrics=metrics)
        plan.encoded, plan.digests = storage.encode(plan.found, flat, self.io.codec)
        plan.bytes = storage.nbytes(plan.encoded)
        memory.check_room(
            plan.bytes,
            f"the save of epoch {plan.epoch} to {plan.path!r}",
            self.options.max_host_bytes,
        )
        if not (self._lock and self._lock.holds()):  # a holder's prefix: checked with its lock
            prepare_prefix(self.db_prefix)
        self.reader.forget(plan.path)
        if self.deletes:
            plan.pending.superseded = move_aside(plan.path)

    def conclude(self, plan: SavePlan, posts: Sequence[SavePost]) -> Exception | None:
        """Concludes from every process's post of this node (in process order) whether it starts.

        Sets ``plan.previous`` to the previous save's failure on any process
        and ``plan.problem`` to this save's problem on any process (each
        naming those processes), or None.

        Returns:
            ``plan.problem``.
        """
        plan.previous, plan.problem = self._conclude(
            plan.epoch, plan.path, plan.previous, plan.problem, posts
        )
        return plan.problem

    def conclude_end(
        self, previous: CheckpointSaveError | None, posts: Sequence[SavePost]
    ) -> CheckpointSaveError | None:
        """The last save's failure on any process, from the posts of the end of the saves."""
        return self._conclude(None, None, previous, None, posts)[0]

    def _conclude(self, epoch, path, previous, problem, posts):
        return boundary.conclude(
            posts, epoch, path, previous, problem, private=self.private, record=self.record_failure
        )

    def start(self, plan: SavePlan, *, cancel: bool = False) -> None:
        """Starts the agreed save, or gives it up if ``plan.problem`` (or ``cancel``) says so.

        Raises:
            The problem (carrying the previous save's failure, if any: see
            :func:`~jaxjob._src.base.errors.with_earlier`), else (after starting) the
            previous save's failure.
        """
        problem = plan.problem
        if problem is None and not cancel:
            problem = self._start(plan)
            if not self.options.async_save and problem is None:
                plan.previous = plan.previous or self.finish()
        else:
            put_back(plan.path, plan.pending.superseded)
            if problem is not None:
                self.record_failure(plan.epoch, plan.path, problem)
        if problem is not None:
            raise with_earlier(problem, plan.previous)
        if plan.previous is not None:
            raise plan.previous

    def _start(self, plan: SavePlan) -> CheckpointSaveError | None:
        """Starts the Orbax save on this process; returns its failure, if any."""
        epoch, path, pending = plan.epoch, plan.path, plan.pending
        if self._pending is None:  # what Orbax still reports now is an earlier failed save's
            self.io.drain_failed()
        self.retry_failed()  # what earlier failed saves' threads left after them
        self.last = (path, Stats(epoch, plan.bytes))
        background = background_start.eligible(
            path,
            plan.bytes,
            async_save=self.options.async_save,
            max_host_bytes=self.options.max_host_bytes,
        )
        if self.options.max_host_bytes is not None:
            memory.return_freed_buffers()
        deferred = preemption.DeferredInterrupt()
        try:
            saving.add(path)
            pending.starting, self._pending = True, pending  # a KeyboardInterrupt finishes it
            with deferred:  # Ctrl-C is raised once Orbax (or its worker thread) has the save
                if background:
                    pending.start = self._start_in_background(plan)
                else:
                    logger.debug("Saving epoch %d to %s", epoch, path)
                    self.io.open()
                    with background_start.exclusive():  # not beside a small save's start
                        pending.deadline = self.io.save_async(
                            path, plan.encoded, plan.found, nbytes=plan.bytes
                        )
        except Exception as err:
            self._pending = None
            saving.discard(path)
            if not self.io.abandon_if_stuck(err):  # a silent store: cleaning up would wait again
                self.io.drain_failed()
                self._remove_failed(path)
                put_back(path, pending.superseded)
            failure = self.record_failure(epoch, path, err)
            deferred.raise_if_received()
            return failure
        pending.starting = False
        self.reader.blob_names = plan.found.state_keys
        duration = time.perf_counter() - pending.started
        self.last = (path, dataclasses.replace(self.last[1], duration_s=duration))
        deferred.raise_if_received()  # the save is in flight: train completes it
        return None

    def _start_in_background(self, plan: SavePlan) -> concurrent.futures.Future:
        """Copies the leaves, then starts their Orbax save on the worker thread; its future.

        See :mod:`~jaxjob._src.manager.save.background_start`: :meth:`finish`
        reports a failure of the start like one of the write.
        """
        io = self.io
        io.pass_copy_point()  # the copy is made here
        detached = background_start.detach(plan.encoded)
        io.open()
        path, found, nbytes = plan.path, plan.found, plan.bytes

        def start() -> None:
            try:
                logger.debug("Saving epoch %d to %s (worker thread)", plan.epoch, path)
                io.save_async(path, detached, found, nbytes=nbytes, copied=True)
            except Exception:
                io.drain_failed()
                raise

        return background_start.submit(start)

    @property
    def tier(self) -> str:
        """``"persistent"``, or ``"local"`` for a local-tier copy (its manifests say so).

        Set before the first save, which chooses the codec for good (see :attr:`io`).

        Raises:
            ValueError: If set to another tier after the first save.
        """
        return self._tier

    @tier.setter
    def tier(self, name: str) -> None:
        if self._io is not None and name != self._io.tier:
            raise ValueError(
                f"node {self.node_name!r}'s writer saves to the {self._io.tier!r} tier since its "
                f"first save; it cannot become a {name!r} tier's writer (set tier before saving)"
            )
        self._tier = name

    @property
    def io(self) -> CheckpointIO:
        """This node's I/O handle, made by its first save with the codec chosen once.

        The codec follows ``private`` and ``tier`` (a local-tier copy's
        saves also pass the ``local.save.*`` fail points), both set by then.
        """
        if self._io is None:
            timeout = self.options.write_timeout_s if self.options.async_save else None
            chosen = storage.codec_for(self.private, self.tier)
            self._io = CheckpointIO(self.db_prefix, chosen, tier=self.tier, write_timeout_s=timeout)
        return self._io

    def record_failure(
        self,
        epoch: int,
        path: str,
        err: BaseException | str,
        processes: list[int] | None = None,
        *,
        count: bool = True,
    ) -> CheckpointSaveError:
        failure = as_save_error(epoch, path, err, processes)
        if count:
            self.failures.append(failure)
        else:
            self.failures[-1] = failure
        self.last = (path, Stats(epoch, error=str(failure), action=Action.FAILURE))
        logger.debug("checkpoint failure recorded: %s", failure)
        return failure

    def finish(self) -> CheckpointSaveError | None:
        """Waits for the save in flight; returns its failure, if any (recorded, not raised).

        Interrupted (KeyboardInterrupt), the save stays in flight: the next call waits again.
        """
        pending = self._pending
        if pending is None:
            return None
        deferred = preemption.DeferredInterrupt()
        try:
            if pending.start is not None:  # started on the worker thread
                with deferred:
                    pending.start.result()
            if self.io.asynchronous:
                with deferred:  # Ctrl-C is raised once the save is done
                    self.io.drain(pending.db, pending.deadline)  # bounded on an object store
            if pending.starting and not is_committed(pending.db):
                raise RuntimeError(
                    f"a KeyboardInterrupt stopped the start of the save of epoch {pending.epoch}"
                    "; nothing of it was committed"
                )
        except Exception as err:
            self._pending = None
            saving.discard(pending.db)
            if not self.io.abandon_if_stuck(err):  # a silent store: cleaning up would wait again
                self._remove_failed(pending.db)
                put_back(pending.db, pending.superseded)
            failure = self.record_failure(pending.epoch, pending.db, err)
            self._on_failure(pending.epoch)
            if deferred.received:  # the KeyboardInterrupt goes up, not the failure: log it
                logger.warning("Unable to write checkpoint for epoch %d: %s", pending.epoch, err)
            deferred.raise_if_received()
            return failure
        self._pending = None
        saving.discard(pending.db)
        if pending.superseded:
            remove_superseded(pending.superseded)
        if self.last is not None and self.last[0] == pending.db:
            commit = time.perf_counter() - pending.started
            self.last = (pending.db, dataclasses.replace(self.last[1], commit_s=commit))
        deferred.raise_if_received()
        return None

    def _remove_failed(self, path: str) -> None:
        """Removes what the failed save of ``path`` left (and drops its deferred checksums)."""
        self.io.forget_failed(path)  # the host copies its commit would hash
        if self.deletes:
            self._failed.remove(path)

    def retry_failed(self) -> None:
        """Removes again what earlier failed saves left (their threads may have written more)."""
        if self.deletes:
            self._failed.retry(busy=self._pending.db if self._pending else None)

    def load(
        self,
        path: str,
        found: manifest.Manifest,
        names: Sequence[str],
        *,
        targets: Mapping[str, Any] | None = None,
    ) -> Workspace:
        """Restores ``names`` through :attr:`reader`; the load is this node's last action."""
        loaded, stats = self.reader.load(path, found, names, targets=targets)
        self.last = (path, stats)
        return loaded

    def close(self) -> None:
        """Releases Orbax's resources and the lock, without waiting for a save in flight.

        A save still starting on the worker thread is let start first (Orbax's
        resources are not released under it).
        """
        if self._pending is not None and self._pending.start is not None:
            concurrent.futures.wait([self._pending.start])
        if self._io is not None:
            self._io.close()
        if self._lock is not None:
            self.retry_failed()
        self.reader.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
