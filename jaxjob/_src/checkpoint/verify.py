"""Checking that committed checkpoints are intact: commit marker, manifest, leaf checksums."""

from __future__ import annotations

import os

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CorruptCheckpointError
from jaxjob._src.checkpoint import checksum, files, leaf_check, manifest, run_identity
from jaxjob._src.checkpoint.io import CheckpointIO
from jaxjob._src.checkpoint.layout import is_committed
from jaxjob._src.checkpoint.listing import list_checkpoints

__all__ = ["checkpoints_under", "verify", "verify_checkpoint", "verify_each"]


def _is_checkpoint_dir(path: str) -> bool:
    return is_committed(path) or fs.exists(fs.join(path, manifest.MANIFEST_ITEM))


def checkpoints_under(path: str | os.PathLike) -> list[str]:
    """The checkpoint directories :func:`verify` checks: ``path``, or the committed ones under it.

    Raises:
        FileNotFoundError: If ``path`` is neither a checkpoint directory nor a
            db_prefix holding committed checkpoints.
    """
    path = fs.normalize(path, "path")
    if _is_checkpoint_dir(path):
        return [path]
    rows = [row for row in list_checkpoints(path) if row.committed]
    if not rows:
        raise FileNotFoundError(f"no committed checkpoint under {path!r}")
    return [row.path for row in rows]


def verify(path: str | os.PathLike) -> list[str]:
    """Checks one checkpoint directory, or every committed checkpoint under a ``db_prefix``.

    Uncommitted directories under a db_prefix (saves in flight or killed) are
    not checked: they are never listed or loaded. Host-local leaves saved by
    several processes are read as process 0's copy. A checkpoint read
    through a db_prefix, or a directory inside one, must be of the prefix's
    run (:mod:`jaxjob._src.checkpoint.run_identity`). The ``jaxjob verify``
    command gives the same verdict (:func:`verify_each`).

    Args:
        path: A checkpoint directory or a ``db_prefix`` (local, ``gs://``, ``s3://``).

    Returns:
        One line per problem (empty when everything is intact), each naming
        the checkpoint directory and, for a leaf, its key path.

    Raises:
        FileNotFoundError: If there is no checkpoint at ``path``.

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxjob
        >>> prefix = tempfile.mkdtemp()
        >>> ckpt = jaxjob.CheckpointManager(prefix)
        >>> ckpt.save(0, {"params": {"w": jnp.ones(3)}})
        >>> ckpt.close()
        >>> verify(prefix)  # the lines `jaxjob verify` prints: none for a sound checkpoint
        []
    """
    return [line for _, lines in verify_each(path) for line in lines]


def verify_each(path: str | os.PathLike) -> list[tuple[str, list[str]]]:
    """``(checkpoint directory, its problems)`` for each checkpoint :func:`verify` checks.

    Raises:
        FileNotFoundError: If there is no checkpoint at ``path``.
    """
    dirs, given = checkpoints_under(path), fs.normalize(path, "path")
    prefix = run_identity.holding_prefix(given) if dirs == [given] else given
    return [(d, verify_checkpoint(d, db_prefix=prefix)) for d in dirs]


def verify_checkpoint(
    path: str,
    *,
    reader: CheckpointIO | None = None,
    found: manifest.Manifest | None = None,
    data: bool = True,
    db_prefix: str | None = None,
    max_host_bytes: int | None = None,
) -> list[str]:
    """The problems of the checkpoint directory ``path``: one line each (see :func:`verify`).

    Every file is checked against the file table (size and CRC-32C), then
    every leaf is read, on this process alone (no other process takes part,
    so it can be called from any process of a job or outside one), and
    checked against the CRC-32C of its shards.

    Args:
        path: A checkpoint directory.
        reader: The handle to read with (a manager's); by default one
            reading on this process alone is opened and closed.
        found: Its manifest, if already read.
        data: Also check the CRC-32C of the stored bytes of the OCDBT data
            files (the leaf check reads their values either way: False
            spares the second read, as the resume decision does).
        db_prefix: The db_prefix it was listed under: its manifest must
            name that prefix's run (:mod:`jaxjob._src.checkpoint.run_identity`).
        max_host_bytes: A host-memory budget: the leaves are read in batches
            of at most this many bytes.

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxjob
        >>> ckpt = jaxjob.CheckpointManager(tempfile.mkdtemp())
        >>> ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(3)}))
        >>> ckpt.wait_until_finished()
        >>> verify_checkpoint(ckpt.get_ckpt_db_name("local", 0))
        []
    """
    if not is_committed(path):
        return [f"{path}: not committed (no commit marker): an interrupted or unfinished save"]
    try:
        found, data_files = files.read_checked(path, db_prefix=db_prefix, data=data, found=found)
        records = checksum.read_records(path, found)
    except CorruptCheckpointError as err:  # its message names the checkpoint and the files
        return [str(err)]
    except run_identity.LineageError as err:  # the prefix's, not this checkpoint's
        return [f"{path}: {err}"]
    except (OSError, ValueError) as err:
        return [f"{path}: unreadable ({type(err).__name__}): {err}"]
    if reader is not None:
        lines = leaf_check.check_all(reader, path, found, records, max_host_bytes=max_host_bytes)
    else:
        with CheckpointIO.alone(path) as alone:
            lines = leaf_check.check_all(alone, path, found, records, max_host_bytes=max_host_bytes)
    # a damaged data file whose leaves name it already is said once; bytes no leaf reads, here
    named = [
        str(checksum.corrupt(found.epoch, path, line))
        for rel, line in data_files.items()
        if not _mentions(lines, rel)
    ]
    return lines + named


def _mentions(lines: list[str], relative: str) -> bool:
    return any(relative in line for line in lines)
