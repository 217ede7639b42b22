"""Reading one tier's checkpoints back: loads, saved shapes and shardings, verification.

A :class:`TierReader` reads through its tier's node writers' readers
(:class:`~jaxjob._src.manager.reader.NodeReader`, each caching the manifests
it read) and merges the nodes' leaves into one workspace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import jax

from jaxjob._src.checkpoint import manifest, storage, verify
from jaxjob._src.checkpoint.layout import check_epoch, common_epochs, db_name, is_committed
from jaxjob._src.core.workspace import Workspace

if TYPE_CHECKING:
    from jaxjob._src.manager.save.writer import NodeWriter
    from jaxjob._src.manager.shared import CheckpointOptions

__all__ = ["ReadTier", "TierReader"]


class ReadTier(Protocol):
    """What a :class:`TierReader` reads of its tier (:class:`~jaxjob._src.manager.tier.Tier`)."""

    db_prefix: str
    path_prefix: str | None
    keyed: bool
    options: CheckpointOptions
    key_nodes: dict[str, str]

    @property
    def writers(self) -> list[NodeWriter]:
        """Its node writers, in node order."""
        ...

    def loading(self) -> None:
        """Marks the tier's last action a load (its stats are then exchanged)."""
        ...


class TierReader:
    """Reads the checkpoints of one tier.

    Args:
        tier: The tier whose node writers' readers it reads through.
    """

    def __init__(self, tier: ReadTier) -> None:
        self.tier = tier

    @property
    def db_prefix(self) -> str:
        """The tier's directory."""
        return self.tier.db_prefix

    def checkpoint(
        self, writer: NodeWriter, epoch: int, path_prefix: str | None = None
    ) -> tuple[str, manifest.Manifest]:
        """The committed checkpoint of ``writer`` 's node at ``epoch`` and its manifest."""
        return writer.reader.checkpoint(epoch, path_prefix or self.tier.path_prefix)

    def resumed(self) -> list[NodeWriter]:
        """The writers whose checkpoints this process resumes.

        Every node of a single-node tier; of a multi-node tier, this process's
        own nodes and those every process saves together.
        """
        if not self.tier.keyed:
            return self.tier.writers
        me = jax.process_index()
        return [w for w in self.tier.writers if w.owner_process in (None, me)]

    def resumed_nodes(self) -> set[str] | None:
        """The nodes of :meth:`resumed`; None: every node (a tier of one node)."""
        if len(self.tier.writers) == 1:
            return None
        return {w.node_name for w in self.resumed()}

    @property
    def timeout_s(self) -> float:
        """How long a wait on the other processes during a restore may take."""
        return self.tier.options.timeout_s

    def load(
        self,
        epoch: int,
        path_prefix: str | None = None,
        *,
        targets: Mapping[str, Any] | None = None,
    ) -> Workspace:
        """Loads and merges the persistent leaves of the :meth:`resumed` nodes at ``epoch``.

        Raises:
            FileNotFoundError: If ``epoch`` is not committed (lists those that are).
            ValueError: If a target differs from the checkpoint (names the key path).
        """
        self.tier.loading()
        merged: dict[str, Any] = {}
        for writer in self.resumed():
            path, found = self.checkpoint(writer, epoch, path_prefix)
            writer.reader.blob_names = found.state_keys
            loaded = writer.load(path, found, found.state_keys, targets=targets)
            if self.tier.keyed:
                self.tier.key_nodes.update(dict.fromkeys(loaded, writer.node_name))
            merged.update(loaded)
        return Workspace(merged)

    def load_blobs(self, blob_names: Iterable[str], epoch: int) -> Workspace:
        """Loads those of ``blob_names`` that each node's checkpoint of ``epoch`` holds."""
        names = list(blob_names)
        self.tier.loading()
        merged: dict[str, Any] = {}
        for writer in self.tier.writers:
            path, found = self.checkpoint(writer, epoch)
            merged.update(writer.load(path, found, [n for n in names if n in found.state]))
        return Workspace(merged)

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the stop-condition outputs saved with ``epoch`` by the nodes :meth:`load` reads."""
        merged: dict[str, Any] = {}
        for writer in self.resumed():
            path, found = self.checkpoint(writer, epoch)
            merged.update(
                writer.reader.restore(path, found, found.output_keys, item=storage.OUTPUTS)
            )
        return Workspace(merged)

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves :meth:`load` reads at ``epoch`` (no array data read)."""
        merged: dict[str, Any] = {}
        for writer in self.resumed():
            merged.update(storage.saved_shapes(self.checkpoint(writer, epoch)[1]))
        return merged

    def saved_targets(self, epoch: int) -> dict[tuple[str, ...], Any] | None:
        """The array leaves :meth:`load` reads at ``epoch`` with their saved shardings, by key path.

        None if any node's checkpoint was saved on other devices than this job's.
        """
        merged: dict[tuple[str, ...], Any] = {}
        for writer in self.resumed():
            found = storage.saved_targets(*self.checkpoint(writer, epoch))
            if found is None:
                return None
            merged.update(found)
        return merged

    def check_db_exists(self, epoch: int) -> bool:
        """Whether every node's checkpoint of ``epoch`` is committed."""
        epoch = check_epoch(epoch)
        prefix = self.tier.db_prefix
        return all(is_committed(db_name(epoch, w.node_name, prefix)) for w in self.tier.writers)

    def verify(self, epoch: int, nodes: Sequence[str], *, data: bool = True) -> list[str]:
        """Reads the checkpoints of ``nodes`` at ``epoch`` here and checks their checksums.

        A single-node tier read by this process alone verifies through its
        node's cached manifest and reader.

        Returns:
            One line per damaged leaf or file; empty when intact.

        Raises:
            FileNotFoundError: If a node's checkpoint of ``epoch`` is not committed.
        """
        writers = self.tier.writers
        if not self.tier.keyed and [w.node_name for w in writers] == list(nodes):
            (writer,) = writers
            if writer.private or jax.process_count() == 1:
                return writer.reader.verify(epoch, self.tier.path_prefix, data=data)
        lines: list[str] = []
        prefix, path_prefix = self.tier.db_prefix, self.tier.path_prefix
        for node in nodes:
            path = db_name(epoch, node, prefix, path_prefix)
            if not is_committed(path):
                raise FileNotFoundError(
                    f"no committed checkpoint for node {node!r} at epoch {epoch} ({path!r}); "
                    f"committed epochs: {common_epochs(prefix, [node], path_prefix)}"
                )
            folder = path.rpartition("/")[0]  # the db_prefix, or a path_prefix's folder
            budget = self.tier.options.max_host_bytes
            lines += verify.verify_checkpoint(
                path, data=data, db_prefix=folder, max_host_bytes=budget
            )
        return lines
