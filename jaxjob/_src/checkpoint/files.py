"""A committed checkpoint's files against its file table (``jaxjob/files.json``).

The committing process writes the table last, just before the commit marker
(:mod:`jaxjob._src.base.file_table`, :mod:`jaxjob._src.internals.orbax_commit`):
every file's size and CRC-32C. Every read of a checkpoint starts here, before
Orbax opens any of its files: a deleted, truncated, swapped or damaged
metadata file (``_CHECKPOINT_METADATA``, ``_METADATA``, ``_sharding``,
``array_metadatas/*``, the OCDBT manifests and B-tree nodes, jaxjob's own
files) is a :class:`~jaxjob.CorruptCheckpointError` naming the file, never an
Orbax or JSON error.
"""

from __future__ import annotations

from jaxjob._src.base import file_table, fs
from jaxjob._src.base.file_table import CHECKPOINT_TABLE as FILE_TABLE
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import checksum, manifest, run_identity
from jaxjob._src.checkpoint.layout import is_committed, parse_name

__all__ = ["FILE_TABLE", "SMALL_DATA", "check", "problems", "read_checked", "unread"]

logger = get_logger(__name__)


_NAMES = {
    FILE_TABLE: "the file table",
    f"{manifest.MANIFEST_ITEM}/{manifest.MANIFEST_FILE}": "the manifest",
    "_CHECKPOINT_METADATA": "Orbax's step metadata",
    "commit_success.txt": "the commit marker",
}


def _name(relative: str, path: str) -> str:
    """How an error names a checkpoint's file: ``the manifest '/c/local.3/jaxjob/...'``."""
    if relative in _NAMES:
        return f"{_NAMES[relative]} {path!r}"
    if file_table.is_data_file(relative):
        return f"the data file {path!r}"
    return f"the file {path!r}"


SMALL_DATA = 64 << 10  # bytes: a restore checks the CRC of smaller data files, the size of others


def problems(path: str, *, data: bool = True) -> dict[str, str]:
    """The files of the checkpoint ``path`` that differ from its table: relative path -> a line.

    Args:
        path: A committed checkpoint directory.
        data: The CRC of every OCDBT data file; else only of those up to
            :data:`SMALL_DATA` bytes (B-tree nodes, small leaves) and the
            size of larger ones, whose values a restore checks per shard.
    """
    up_to = None if data else SMALL_DATA
    return file_table.problems(path, FILE_TABLE, data_up_to=up_to, name=_name)


def check(path: str, epoch: int | None = None, *, data: bool = False) -> dict[str, str]:
    """Checks the checkpoint ``path`` against its table before anything else reads it.

    A problem in a metadata file raises. Problems in OCDBT data files are
    returned instead: the leaves read from them fail their own checks,
    naming the leaf (:mod:`jaxjob._src.checkpoint.leaf_check`); what no leaf
    read explains is raised after the read (:func:`unread`).

    Args:
        path: A committed checkpoint directory.
        epoch: Its epoch, for the error (by default from its name).
        data: The CRC of every data file (else as :func:`problems` says).

    Returns:
        The data files' problems, relative path -> a line, for the caller
        to raise once the leaves read have been checked (see :func:`unread`).

    Raises:
        CorruptCheckpointError: Naming every damaged, missing or resized
            metadata file.
        FileNotFoundError: If the checkpoint was deleted meanwhile.
        ValueError: If the checkpoint has no table because an older jaxjob
            wrote it (its manifest's format says so).
    """
    found = problems(path, data=data)
    lines = [line for rel, line in found.items() if not file_table.is_data_file(rel)]
    if not lines:
        return {rel: line for rel, line in found.items() if file_table.is_data_file(rel)}
    if not is_committed(path):  # deleted meanwhile (another process's retention): not damaged
        raise FileNotFoundError(f"the checkpoint {path!r} was deleted while it was being read")
    if fs.exists(fs.join(path, manifest.MANIFEST_ITEM, manifest.MANIFEST_FILE)):
        manifest.read(path)  # an older format raises its own error, which says what to do
    if epoch is None:
        parsed = parse_name(path.rstrip("/").rpartition("/")[2])
        epoch = parsed.epoch if parsed is not None else "?"
    raise checksum.corrupt(epoch, path, "; ".join(lines))


def read_checked(
    path: str,
    *,
    epoch: int | None = None,
    db_prefix: str | None = None,
    data: bool = False,
    found: manifest.Manifest | None = None,
) -> tuple[manifest.Manifest, dict[str, str]]:
    """The manifest of the committed checkpoint ``path``, read once its files check out.

    Every read of a checkpoint goes through here: its files against the
    table (:func:`check`), its manifest, and its run.

    Args:
        path: A committed checkpoint directory.
        epoch: Its epoch, for errors (by default from its name).
        db_prefix: The db_prefix it is read through: the manifest must name
            that prefix's run (:mod:`jaxjob._src.checkpoint.run_identity`).
        data: As :func:`check` says.
        found: Its manifest, if already read (the files are checked again).

    Returns:
        The manifest, and the data files' problems (see :func:`check`).
    """
    damaged = check(path, epoch, data=data)
    found = found or manifest.read(path)
    if db_prefix is not None:
        run_identity.check(found, db_prefix)
    return found, damaged


def unread(path: str, epoch: int, damaged: dict[str, str], *, whole: bool) -> None:
    """After a restore whose leaves all checked out: the damaged data files no leaf read.

    Args:
        path: The checkpoint directory.
        epoch: Its epoch.
        damaged: What :func:`check` returned.
        whole: Whether every leaf was restored: then damage anywhere raises;
            a partial restore (whose leaves are intact) logs a warning.

    Raises:
        CorruptCheckpointError: If ``whole`` and a data file is damaged.
    """
    if not damaged:
        return
    error = checksum.corrupt(epoch, path, "; ".join(damaged.values()))
    if whole:
        raise error
    logger.warning("%s (the leaves restored are intact: they checked out as read)", error)
