"""The reading half of one node's checkpoints: manifests read once, one I/O handle, loads."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import files, keypaths, manifest, storage, verify
from jaxjob._src.checkpoint.codec import Codec
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.io import CheckpointIO
from jaxjob._src.checkpoint.layout import check_epoch, db_name, is_committed
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager.records import Action, Stats

__all__ = ["NodeReader"]

logger = get_logger(__name__)


class NodeReader:
    """Reads one node's committed checkpoints under ``db_prefix``; never takes its lock.

    Args:
        db_prefix: The normalized checkpoint directory.
        node_name: The node.
        codec: The node's codec (``storage.codec_for``): a private one reads on
            this process alone. Each checkpoint is decoded as its manifest says.
        host_map: How host-local leaves are resumed on another process count.
        max_host_bytes: The host-memory budget of a restore (None: none).
        committed: Lists the committed epochs, for error messages.
    """

    def __init__(
        self,
        db_prefix: str,
        node_name: str,
        *,
        codec: Codec,
        host_map: HostMap | None,
        committed: Callable[[], list[int]],
        max_host_bytes: int | None = None,
    ) -> None:
        self.db_prefix = db_prefix
        self.node_name = node_name
        self.host_map = host_map
        self.max_host_bytes = max_host_bytes
        self._committed = committed
        self._manifests: dict[str, manifest.Manifest] = {}
        self._damaged: dict[str, dict[str, str]] = {}  # data files no read has explained yet
        self._io = CheckpointIO(db_prefix, codec)
        self.blob_names: list[str] | None = None

    def forget(self, path: str) -> None:
        """Drops the cached manifest of ``path`` (a save is about to replace it)."""
        self._manifests.pop(path, None)
        self._damaged.pop(path, None)

    def checkpoint(
        self, epoch: int, path_prefix: str | None = None
    ) -> tuple[str, manifest.Manifest]:
        """The committed checkpoint directory of ``epoch`` and its manifest (read once).

        Raises:
            FileNotFoundError: If it is not committed (lists the committed epochs).
            CorruptCheckpointError: If its manifest is damaged or malformed, or
                another run saved it (a directory copied in).
        """
        epoch = check_epoch(epoch)
        path = db_name(epoch, self.node_name, self.db_prefix, path_prefix)
        if path not in self._manifests:
            if not is_committed(path):
                raise FileNotFoundError(
                    f"no committed checkpoint for node {self.node_name!r} at epoch {epoch} "
                    f"({path!r}); committed epochs: {self._committed()}"
                )
            prefix = path.rpartition("/")[0]  # the db_prefix holding it
            found, self._damaged[path] = files.read_checked(path, epoch=epoch, db_prefix=prefix)
            self._manifests[path] = found
        return path, self._manifests[path]

    def restore(
        self,
        path: str,
        found: manifest.Manifest,
        names: Sequence[str],
        *,
        item: str = storage.STATE,
        targets: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Restores ``names`` of ``item`` (each whole) from the checkpoint at ``path``."""
        structure = found.structure(item)
        chosen = {n: keypaths.Selection(n, n, (), structure[n]) for n in names}
        restored = storage.restore_selected(
            self._io,
            path,
            found,
            chosen,
            item=item,
            targets=targets,
            host_map=self.host_map,
            max_host_bytes=self.max_host_bytes,
        )
        whole = item == storage.STATE and set(names) == set(structure)
        files.unread(path, found.epoch, self._damaged.get(path, {}), whole=whole)
        return restored

    def load(
        self,
        path: str,
        found: manifest.Manifest,
        names: Sequence[str],
        *,
        targets: Mapping[str, Any] | None = None,
    ) -> tuple[Workspace, Stats]:
        """Restores ``names`` of the persistent leaves, and the stats of that load."""
        start = time.perf_counter()
        logger.info("Loading %s from %s", names, path)
        items = self.restore(path, found, names, targets=targets)
        duration = time.perf_counter() - start
        stats = Stats(found.epoch, storage.nbytes(items), None, duration, action=Action.LOAD)
        return Workspace(items), stats

    def verify(self, epoch: int, path_prefix: str | None = None, *, data: bool = True) -> list[str]:
        """Checks this node's checkpoint of ``epoch`` through the cached manifest and reader.

        Returns:
            One line per damaged leaf or file; empty when intact.
        """
        try:
            path, found = self.checkpoint(epoch, path_prefix)
        except ValueError as err:  # an unreadable manifest: verify_checkpoint says so, in its words
            path = db_name(check_epoch(epoch), self.node_name, self.db_prefix, path_prefix)
            budget = self.max_host_bytes
            lines = verify.verify_checkpoint(path, data=data, max_host_bytes=budget)
            return lines or [str(err)]  # another run's
        return verify.verify_checkpoint(
            path, reader=self._io, found=found, data=data, max_host_bytes=self.max_host_bytes
        )

    def close(self) -> None:
        """Releases the Orbax reader (a later read opens a new one)."""
        self._io.close()
