"""One process's local tier: a checkpoint manager over its own directory, tied to the run.

A manager made with ``local=`` (:class:`~jaxjob._src.manager.local_tier.LocalTier`)
holds a :class:`LocalCopy`: on first use it builds a manager of the same
kind over this process's local directory (the same node save engine, one
process taking part), whose checkpoints record the persistent tier's run
id and the life (attempt) that saved them. Local checkpoints of another run
(a directory reused by a new job) are never resumed from, and are removed by
this run's first local save. The processes resume a local epoch only if all
their copies of it come from one life and their replicated leaves' checksums
agree (:meth:`LocalCopy.lineage`, compared by
:func:`jaxjob._src.run.resume.local_choice`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.leaves import Kind
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import checksum, files, listing, manifest, run_identity
from jaxjob._src.checkpoint.layout import common_epochs, db_name
from jaxjob._src.checkpoint.manifest import same_devices
from jaxjob._src.manager.local_tier import LOCAL, LocalTier
from jaxjob._src.manager.metadata import MetadataHandler

__all__ = ["LocalCopy", "LocalMetadata"]

logger = get_logger(__name__)


class LocalMetadata(MetadataHandler):
    """The local tier's metadata handler: it records nothing (the persistent one does)."""

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
        """Ignored: the persistent manager reports the local tier's stats."""


class LocalCopy:
    """This process's local tier of a manager.

    Args:
        tier: The tier's settings.
        db_prefix: The persistent tier (its run id is the local checkpoints' run).
        make: Builds a manager over a local directory (the persistent manager's kind).
    """

    def __init__(self, tier: LocalTier, db_prefix: str, make: Callable[[str], Any]) -> None:
        self.tier = tier
        self._db_prefix = db_prefix
        self._make = make
        self._manager: Any = None
        self._run: str | None = None
        self._swept = False

    @property
    def directory(self) -> str:
        """This process's local directory."""
        return self.tier.directory(jax.process_index())

    @property
    def manager(self) -> Any:
        """The manager over this process's local directory (made, and its lock taken, on first use).

        Raises:
            CheckpointInUseError: If another live process writes this local directory.
        """
        if self._manager is None:
            manager = self._make(self.directory)
            manager.init(manager.node_names())
            for writer in manager._writers():
                writer.tier = LOCAL
            self._manager = manager
        return self._manager

    def run(self, *, create: bool) -> str | None:
        """The persistent tier's run id (created with ``create``), or None if it has none.

        Without its run file, the run its other evidence names
        (:func:`jaxjob._src.checkpoint.run_identity.prefix_run`).
        """
        if self._run is None:
            find = run_identity.ensure if create else run_identity.prefix_run
            self._run = find(self._db_prefix)
        return self._run

    def nodes(self) -> list[str]:
        """The node names of the local checkpoint directories."""
        return self.manager._checkpoint_nodes()

    def save(
        self,
        epoch: int,
        workspace: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        *,
        lineage: tuple[str, int | None],
    ) -> None:
        """Saves ``epoch`` to this process's local directory, waiting on no other process.

        ``lineage`` is ``(life, resumed_from)``, recorded in its manifests.

        Raises:
            CheckpointSaveError: This save's problem, or a previous local save's failure.
        """
        run = self.run(create=True)
        for writer in self.manager._writers():
            writer._run = run  # its checkpoints record the persistent tier's run
        self.manager.set_lineage(*lineage)  # and the persistent manager's life
        if not self._swept:
            self._remove_other_runs(run)
            if jax.process_index() == 0:
                template = os.path.abspath(os.path.expanduser(self.tier.path))
                listing.record_local_tier(self._db_prefix, template)
            self._swept = True
        self.manager.save(epoch, workspace, outputs=outputs)

    def _remove(self, why: Callable[[int, str], str | None]) -> None:
        """Removes (and logs) each committed local copy that ``why(epoch, path)`` condemns."""
        manager = self.manager
        if not fs.exists(manager.db_prefix):
            return
        for node in self.nodes():
            for epoch in manager._committed(node):
                path = db_name(epoch, node, manager.db_prefix)
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

    def forget_after(self, epoch: int | None) -> None:
        """Removes the committed local checkpoints newer than ``epoch`` (None: all)."""
        self._remove(
            lambda e, path: f"newer than epoch {epoch}" if epoch is None or e > epoch else None
        )

    def candidates(self, newer_than: int | None) -> tuple[list[int], list[str]]:
        """Committed local epochs newer than ``newer_than`` that this process can resume from.

        A candidate is committed for every node, saved by this run, on this
        job's devices and process count, and its manifest, file table and
        checksum files pass their checks. Its arrays are checked against
        their checksums as the resume reads them (read once, not twice).

        Returns:
            ``(epochs, why)``: the candidates, newest first, and one line per
            newer local epoch passed over.
        """
        run = self.run(create=False)
        manager = self.manager
        nodes = self.nodes()
        found: list[int] = []
        why: list[str] = []
        committed = common_epochs(manager.db_prefix, nodes) if fs.exists(manager.db_prefix) else []
        newer = [e for e in committed if newer_than is None or e > newer_than]
        if not newer:
            return [], [f"{manager.db_prefix} holds no epoch newer than {newer_than}"]
        for epoch in reversed(newer):
            problem = _problem(manager, epoch, nodes, run)
            if problem is None:
                found.append(epoch)
            else:
                why.append(f"local epoch {epoch}: {problem}")
        return found, why

    def lineage(self, epochs: list[int]) -> dict[int, dict[str, Any]]:
        """Of each local epoch of ``epochs``: its life and its replicated leaves' checksums.

        Returns:
            ``{epoch: {"life": id or None, "whole": {"<key path> of node '<node>'": crc}}}``:
            ``whole`` holds the ``jax.Array`` leaves this process's copy holds
            whole (replicated over its devices); those must be the same bytes
            on every process. An epoch whose records do not read is left out
            (its restore fails on its own).
        """
        found: dict[int, dict[str, Any]] = {}
        for epoch in epochs:
            try:
                found[epoch] = _lineage(self.manager, epoch, self.nodes())
            except (OSError, ValueError) as err:
                logger.debug("Local epoch %d: no lineage (%s)", epoch, err)
        return found


def _lineage(manager: Any, epoch: int, nodes: list[str]) -> dict[str, Any]:
    """The life and replicated leaves' CRCs of this process's local ``epoch`` (see ``lineage``)."""
    lives, whole = set(), {}
    for node in nodes:
        path = db_name(epoch, node, manager.db_prefix)
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


def _problem(manager: Any, epoch: int, nodes: list[str], run: str | None) -> str | None:
    """Why this process cannot resume from its local ``epoch``, or None."""
    for node in nodes:
        path = db_name(epoch, node, manager.db_prefix)
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
