"""The runner's view of a checkpoint manager: the :class:`Manager` protocol, a null manager.

:class:`Manager` lists exactly what ``run/`` calls on a manager (either
checkpoint manager satisfies it), :class:`Tier` and :class:`LocalTier` what
it calls on the manager's tiers (``manager.tier(name)``) and :class:`Reader`
what it restores from (a tier's ``reader``). :class:`NullManager` is the
manager of a runner made without one: it has no tiers and no nodes, so
nothing is due to be saved, nothing is kept, and the runner never asks
whether it has a manager.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from jaxjob._src.base.errors import CheckpointSaveError
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager.local_copy import LocalMetadata
from jaxjob._src.manager.local_tier import LOCAL, PERSISTENT
from jaxjob._src.manager.metadata import MetadataHandler
from jaxjob._src.manager.shared import CheckpointOptions

__all__ = ["LocalTier", "Manager", "NullManager", "Reader", "Tier", "tiers_of"]


class Reader(Protocol):
    """What the runner restores from: a tier's checkpoints (``tier.reader``)."""

    db_prefix: str  # where the checkpoints live
    timeout_s: float  # how long a wait on the other processes may take, in seconds

    def resumed_nodes(self) -> set[str] | None:
        """The nodes whose checkpoints this process resumes from; None: every node."""
        ...

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves saved at ``epoch``."""
        ...

    def saved_targets(self, epoch: int) -> dict[tuple[str, ...], Any] | None:
        """The array leaves saved at ``epoch`` with their shardings, by key path (or None)."""

    def load(self, epoch: int, *, targets: Mapping[str, Any] | None = None) -> Workspace:
        """Loads the persistent workspace saved at ``epoch``."""
        ...

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the stop-condition outputs saved with ``epoch``."""
        ...


class Tier(Protocol):
    """What the runner calls on a tier of the manager (``manager.tier(name)``)."""

    name: str  # "persistent" or "local"
    db_prefix: str  # its directory
    reader: Reader  # reads its checkpoints back

    @property
    def required_outputs(self) -> tuple[str, ...]:
        """Names of epoch-group outputs to pass to :meth:`save` (e.g. what retention ranks by)."""
        ...

    def set_lineage(self, life: str, resumed_from: int | None) -> None:
        """Names the life whose saves follow, and the epoch it resumed from."""

    def committed_epochs(self) -> list[int]:
        """Its committed epochs, ascending."""
        ...

    def save(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Starts saving ``workspace`` as its checkpoint ``epoch``."""

    def has_pending(self) -> bool:
        """Whether a save of this process is in flight."""
        ...

    def finish(self) -> list[CheckpointSaveError]:
        """Completes this process's saves in flight without waiting on other processes."""
        ...

    def take_metadata_failures(self) -> list[CheckpointSaveError]:
        """The metadata records that failed since the last call (save failures)."""
        ...

    def report_stats(self, action_name: str) -> None:
        """Reports its last action's stats to the metadata handler."""


class LocalTier(Tier, Protocol):
    """What the runner calls on the local tier (``manager.tier("local")``) besides a tier's."""

    settings: Any  # the jaxjob.LocalTier it was made with (every_epochs, every_seconds)

    def candidates(self, newer_than: int | None) -> tuple[list[int], list[str]]:
        """This process's local epochs newer than ``newer_than`` it can resume from, and why not."""
        ...

    def lineage(self, epochs: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Of each local epoch of ``epochs``: the life that saved it, its whole leaves' CRCs."""
        ...

    def forget(self, epoch: int | None) -> None:
        """Removes this process's local checkpoints newer than ``epoch`` (None: all of them)."""


class Manager(Protocol):
    """What the runner calls on a checkpoint manager (and, through :meth:`tier`, its tiers)."""

    @property
    def options(self) -> CheckpointOptions:
        """Its options (the runner reads ``timeout_s``)."""
        ...

    @property
    def db_prefix(self) -> str:
        """Where the checkpoints live."""
        ...

    @property
    def metadata_handler(self) -> MetadataHandler:
        """The handler that decides the resume epoch and receives the stats."""
        ...

    def tier(self, name: str) -> Any:
        """The tier ``name`` (``"persistent"`` or ``"local"``; a :class:`Tier`), or None."""
        ...

    def set_params(self, nodes: Sequence[str]) -> None:
        """Passes the checkpoint location and the job's nodes to the metadata handler."""

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from, or None for a fresh start."""

    def node_names(self) -> list[str]:
        """The nodes whose checkpoints (and locks) the manager handles; after ``init``."""
        ...

    def init(
        self,
        nodes: Sequence[str],
        retrieve_from_epoch: int | None = None,
        *,
        key_nodes: Mapping[str, str] | None = None,
    ) -> None:
        """Prepares to save or load."""

    def committed_epochs(self) -> list[int]:
        """The committed epochs, ascending."""
        ...

    def load_blobs_locally(
        self, nodes: Sequence[str], blob_names: Iterable[str], epoch: int, session: Any
    ) -> bool:
        """Loads named leaves into ``session.workspace``; False if a checkpoint is missing."""
        ...

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Whether checkpoints (of ``epoch``; without it: for the next save) are accessible."""
        ...

    def save(self, epoch: int, workspace: Mapping[str, Any], *, outputs: Any = None) -> None:
        """Starts saving ``workspace`` as checkpoint ``epoch``."""

    def write_checkpoint_metadata(self, epoch: int) -> None:
        """Tells the metadata handler that ``epoch`` is saved, once committed."""

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Reports the last action's stats to the metadata handler."""

    def wait_until_finished(self) -> None:
        """Blocks until every save in flight is committed (every process)."""


def tiers_of(manager: Manager) -> list[Tier]:
    """The manager's tiers: persistent, then local if any (a :class:`NullManager` has none)."""
    found = [manager.tier(PERSISTENT), manager.tier(LOCAL)]
    return [tier for tier in found if tier is not None]


def _needs(what: str) -> ValueError:
    return ValueError(f"{what} needs a checkpoint_manager")


class NullManager:
    """The manager of a runner without a checkpoint manager: no tiers, nothing saved or loaded.

    No save is ever due (it has no tier); what only a manager can do (resume
    from an epoch, load leaves) raises a ``ValueError`` naming it.

    Example:
        >>> manager = NullManager()
        >>> tiers_of(manager), manager.node_names(), manager.committed_epochs()
        ([], [], [])
        >>> manager.get_resume_from_epoch_id(None) is None
        True
        >>> manager.get_resume_from_epoch_id(3)
        Traceback (most recent call last):
        ...
        ValueError: resume_from_epoch needs a checkpoint_manager to load from
    """

    options = CheckpointOptions()
    db_prefix = ""

    def __init__(self) -> None:
        self.metadata_handler: MetadataHandler = LocalMetadata()  # records nothing

    def tier(self, name: str) -> None:
        """None: there is no tier."""
        return None

    def set_params(self, nodes: Sequence[str]) -> None:
        """Nothing to pass on."""

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """None (a fresh start); raises for a ``user_epoch``: there is nothing to load it from."""
        if user_epoch is not None:
            raise ValueError("resume_from_epoch needs a checkpoint_manager to load from")
        return None

    def node_names(self) -> list[str]:
        """No nodes: no history file, no locks."""
        return []

    def init(self, nodes: Sequence[str], retrieve_from_epoch: int | None = None, **_: Any) -> None:
        """Nothing to prepare."""

    def committed_epochs(self) -> list[int]:
        """None."""
        return []

    def load_blobs_locally(
        self, nodes: Sequence[str], blob_names: Iterable[str], epoch: int, session: Any
    ) -> bool:
        """Raises: ``JobRunner.load_blobs_from_checkpoints`` needs a manager."""
        raise _needs("load_blobs_from_checkpoints")

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """False: there are no checkpoints."""
        return False

    def save(self, epoch: int, workspace: Mapping[str, Any], *, outputs: Any = None) -> None:
        """Raises: ``JobRunner.save_checkpoints`` needs a manager."""
        raise _needs("save_checkpoints")

    def write_checkpoint_metadata(self, epoch: int) -> None:
        """Nothing to record."""

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Nothing to report."""

    def wait_until_finished(self) -> None:
        """Nothing is in flight."""
