"""One process's local tier: a tier of the manager over its own directory, tied to the run.

A manager made with ``local=`` (:class:`~jaxjob._src.manager.local_tier.LocalTier`)
holds a :class:`LocalCopy`: a :class:`~jaxjob._src.manager.tier.Tier` of the
same nodes over this process's local directory (the same node save engine,
this process alone taking part), whose writers are made, and their locks
taken, on first use. Its checkpoints record the persistent tier's run id and
the life (attempt) that saved them. Local checkpoints of another run (a
directory reused by a new job) are never resumed from, and are removed by
this run's first local save. The processes resume a local epoch only if all
their copies of it come from one life and their replicated leaves' checksums
agree (:meth:`LocalCopy.lineage`, compared by
:func:`jaxjob._src.run.resume.local_choice`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CheckpointInUseError, CheckpointSaveError
from jaxjob._src.base.leaves import Kind
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import checksum, files, listing, manifest, run_identity
from jaxjob._src.checkpoint.layout import common_epochs, db_name
from jaxjob._src.checkpoint.manifest import same_devices
from jaxjob._src.manager.local_tier import LOCAL, LocalTier
from jaxjob._src.manager.metadata import MetadataHandler, MetadataRecord
from jaxjob._src.manager.tier import Tier

__all__ = ["LocalCopy", "LocalMetadata"]

logger = get_logger(__name__)


class LocalMetadata(MetadataHandler):
    """The local tier's metadata handler: it records nothing (the persistent one does).

    Args:
        persistent: The persistent tier's handler, which receives the local tier's
            stats (None: they are dropped).
    """

    def __init__(self, persistent: MetadataHandler | None = None) -> None:
        self.persistent = persistent

    def set_params(self, **kwargs: Any) -> None:
        """Ignored."""

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        """``user_epoch``: the local tier's epochs are chosen from its listing."""
        return user_epoch

    def write(self, epoch: int) -> None:
        """Nothing: a local epoch has no metadata record."""

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Always True."""
        return True

    def report(self, action_name: str, stats: dict[str, Any]) -> None:
        """Passes the stats (each entry with ``"tier": "local"``) to the persistent handler."""
        if self.persistent is not None:
            self.persistent.report(action_name, stats)


class LocalCopy(Tier):
    """This process's local tier of a manager.

    Args:
        settings: The tier's settings (``local=``).
        persistent: The manager's persistent tier: its run id is the local
            checkpoints' run, its life theirs, its handler gets their stats.
        nodes: The manager's node names (its writers' nodes: those of the local copy).
    """

    def __init__(self, settings: LocalTier, persistent: Tier, nodes: Callable[[], list[str]]):
        directory = settings.directory(jax.process_index())
        super().__init__(
            LOCAL,
            directory,
            dataclasses.replace(persistent.options, host_map=None, storage_timeout_s=None),
            MetadataRecord(LocalMetadata(persistent.metadata.handler), directory),
            keep=settings.keep,
            keyed=persistent.keyed,
            alone=True,
            key_nodes=persistent.key_nodes,
        )
        self.settings = settings
        self.tagged = True
        self.persistent = persistent
        self._node_names = nodes
        self._opened = False
        self._swept = False

    def opened(self) -> list[Any]:
        """Its writers, made (and their locks taken) on first use.

        Raises:
            CheckpointInUseError: If another live process writes this local directory.
            NotADirectoryError: If the local directory is a file.
        """
        if self._opened:
            return self.writers
        if fs.exists(self.db_prefix) and not fs.is_dir(self.db_prefix):
            raise NotADirectoryError(
                f"LocalTier path {self.settings.path!r} is a file here ({self.db_prefix!r}), "
                "not a directory"
            )
        nodes = self._node_names()
        owner = jax.process_index() if jax.process_count() > 1 else None
        self.open(nodes, dict.fromkeys(nodes, owner))  # this process alone writes it
        try:
            for writer in self.writers:
                writer.take_lock()  # an unwritable directory is reported by the first save
        except BaseException:
            self.adopt([])
            raise
        self._opened = True
        return self.writers

    def run_id(self, *, create: bool) -> str | None:
        """The persistent tier's run id (created with ``create``), or None if it has none.

        Without its run file, the run its other evidence names
        (:func:`jaxjob._src.checkpoint.run_identity.prefix_run`).
        """
        if self.run is None:
            find = run_identity.ensure if create else run_identity.prefix_run
            self.run = find(self.persistent.db_prefix)
        return self.run

    def save(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Saves ``epoch`` to this process's local tier, waiting on no other process.

        The checkpoint holds this process's shards and host-local leaves; it
        is committed atomically and durably (asynchronously, like the
        manager's ``save``), and records the persistent tier's run and life.
        Its stats go to the metadata handler (``"checkpoint_save"``,
        ``"tier": "local"``).

        Raises:
            CheckpointSaveError: This save's problem, or a previous local save's failure.
            CheckpointInUseError: If another live process writes this local directory.
        """
        self.persistent.flush_committed_metadata()
        try:
            self.opened()
            run = self.run_id(create=True)
            if not self._swept:
                self._remove_other_runs(run)
                if jax.process_index() == 0:
                    template = os.path.abspath(os.path.expanduser(self.settings.path))
                    listing.record_local_tier(self.persistent.db_prefix, template)
                self._swept = True
            self.set_lineage(*self.persistent.life)  # the persistent tier's life
            super().save(epoch, workspace, outputs=outputs)
        finally:
            self.report_stats("checkpoint_save")

    def finish(self) -> list[CheckpointSaveError]:
        """Waits for this process's local save in flight; removes what failed ones left.

        Returns:
            Its failure, if any (recorded, not raised).
        """
        if not self._opened:
            return []
        try:
            self.wait_until_finished()  # one process's tier: waits on no other process
        except CheckpointSaveError as err:
            return [err]
        finally:
            for writer in self.writers:
                writer.retry_failed()  # what failed saves' threads wrote after their cleanup
        return []

    def committed_epochs(self, nodes: list[str] | None = None) -> list[int]:
        """Epochs committed in this process's local directory for every node, ascending."""
        self.opened()
        return common_epochs(self.db_prefix, list(nodes or self.nodes()))

    def _remove(self, why: Callable[[int, str], str | None]) -> None:
        """Removes (and logs) each committed local copy that ``why(epoch, path)`` condemns."""
        self.opened()
        nodes = self.nodes()
        if not fs.exists(self.db_prefix):
            return
        for node in nodes:
            for epoch in common_epochs(self.db_prefix, [node]):
                path = db_name(epoch, node, self.db_prefix)
                reason = why(epoch, path)
                if reason is not None:
                    logger.info("Removing the local checkpoint %s: %s", path, reason)
                    fs.rmtree(path)

    def _remove_other_runs(self, run: str) -> None:
        """Removes committed local checkpoints of another run (a reused directory)."""

        def other_run(epoch: int, path: str) -> str | None:
            other = _run_of(path)
            return None if other in (None, run) else f"another run saved it ({other}, not {run})"

        self._remove(other_run)

    def forget(self, epoch: int | None) -> None:
        """Removes this process's local checkpoints newer than ``epoch`` (None: all of them).

        The runner calls it once it knows where the run goes on from (a fresh
        start, or the epoch it resumed from): a newer local epoch is what a
        killed life of the job left, and must never be resumed from later.
        """
        self._remove(
            lambda e, path: f"newer than epoch {epoch}" if epoch is None or e > epoch else None
        )

    def candidates(self, newer_than: int | None) -> tuple[list[int], list[str]]:
        """This process's local epochs newer than ``newer_than`` it can resume from, newest first.

        A candidate is committed for every node, saved by this run, on this
        job's devices and process count, and its manifest, file table and
        checksum files pass their checks. Its arrays are checked against
        their checksums as the resume reads them (read once, not twice).

        Returns:
            ``(epochs, why)``: the candidates, newest first, and one line per
            newer local epoch passed over (or why the tier cannot be read here).
        """
        try:
            return self._candidates(newer_than)
        except (OSError, ValueError, CheckpointInUseError) as err:  # another writer's, unreadable
            return [], [f"the local tier cannot be read here: {err}"]

    def _candidates(self, newer_than: int | None) -> tuple[list[int], list[str]]:
        run = self.run_id(create=False)
        self.opened()
        nodes = self.nodes()
        found: list[int] = []
        why: list[str] = []
        committed = common_epochs(self.db_prefix, nodes) if fs.exists(self.db_prefix) else []
        newer = [e for e in committed if newer_than is None or e > newer_than]
        if not newer:
            return [], [f"{self.db_prefix} holds no epoch newer than {newer_than}"]
        for epoch in reversed(newer):
            problem = _problem(self.db_prefix, epoch, nodes, run)
            if problem is None:
                found.append(epoch)
            else:
                why.append(f"local epoch {epoch}: {problem}")
        return found, why

    def lineage(self, epochs: list[int]) -> dict[int, dict[str, Any]]:
        """Of each local epoch of ``epochs``: the life that saved it, its replicated leaves' CRCs.

        Returns:
            ``{epoch: {"life": id or None, "whole": {"<key path> of node '<node>'": crc}}}``:
            ``whole`` holds the ``jax.Array`` leaves this process's copy holds
            whole (replicated over its devices); those must be the same bytes
            on every process. An epoch whose records do not read is left out
            (its restore fails on its own).
        """
        self.opened()
        found: dict[int, dict[str, Any]] = {}
        for epoch in epochs:
            try:
                found[epoch] = _lineage(self.db_prefix, epoch, self.nodes())
            except (OSError, ValueError) as err:
                logger.debug("Local epoch %d: no lineage (%s)", epoch, err)
        return found

    def close(self) -> None:
        """Waits for its save in flight, then releases its writers and locks (if it made them)."""
        if self._opened:
            super().close()


def _lineage(directory: str, epoch: int, nodes: list[str]) -> dict[str, Any]:
    """The life and replicated leaves' CRCs of this process's local ``epoch`` (see ``lineage``)."""
    lives, whole = set(), {}
    for node in nodes:
        path = db_name(epoch, node, directory)
        found = manifest.read(path)
        lives.add(found.life)
        for name, records in checksum.read_records(path, found).items():
            spec = found.leaves.get(name)
            if spec is not None and _is_whole(spec, records):
                whole[f"{spec.path} of node {node!r}"] = records[0][1]
    life = lives.pop() if len(lives) == 1 else f"several: {sorted(map(str, lives))}"
    return {"life": life, "whole": whole}


def _is_whole(spec: Any, records: list[checksum.Record]) -> bool:
    """Whether ``records`` are one shard covering the whole of a ``jax.Array`` leaf."""
    if spec.kind not in (Kind.JAX, Kind.PRNG_KEY) or len(records) != 1:
        return False
    index = records[0][0]
    rank = len(spec.shape)
    return all(a == 0 for a, _ in index) and tuple(b for _, b in index[:rank]) == tuple(spec.shape)


def _run_of(path: str) -> str | None:
    try:
        return manifest.read(path).run
    except (OSError, ValueError):
        return None


def _problem(directory: str, epoch: int, nodes: list[str], run: str | None) -> str | None:
    """Why this process cannot resume from its local ``epoch``, or None."""
    for node in nodes:
        path = db_name(epoch, node, directory)
        try:
            found = manifest.read(path)
        except (OSError, ValueError) as err:
            return f"its manifest does not read ({err})"
        if found.tier != LOCAL or found.owner_process not in (None, jax.process_index()):
            return (
                f"not this process's local copy (tier {found.tier}, process {found.owner_process})"
            )
        if run is None or found.run != run:
            return f"saved by another run ({found.run}, the persistent tier's is {run})"
        if not same_devices(found):
            return (
                f"saved by {found.process_count} processes on {found.devices.get('count')} "
                f"{found.devices.get('platform')} devices (this job: {jax.process_count()} on "
                f"{jax.device_count()} {jax.devices()[0].platform} devices)"
            )
        try:  # the file table and the checksum files; the arrays are checked as they are read
            files.read_checked(path, data=False, found=found)
            checksum.read_records(path, found)
        except (OSError, ValueError) as err:
            return str(err)
    return None
