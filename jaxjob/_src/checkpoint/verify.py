"""Checking that committed checkpoints are intact: commit marker, manifest, leaf checksums."""

from __future__ import annotations

import os

from jaxjob._src.base import fs
from jaxjob._src.checkpoint import checksum, manifest
from jaxjob._src.checkpoint.layout import is_committed
from jaxjob._src.checkpoint.listing import list_checkpoints

__all__ = ["checkpoints_under", "verify", "verify_checkpoint"]


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
    several processes are read as process 0's copy.

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
        >>> verify(prefix)  # jaxjob._src.checkpoint.verify.verify
        []
    """
    return [line for d in checkpoints_under(path) for line in verify_checkpoint(d)]


def verify_checkpoint(path: str) -> list[str]:
    """The problems of the checkpoint directory ``path``: one line each (see :func:`verify`)."""
    if not is_committed(path):
        return [f"{path}: not committed (no commit marker): an interrupted or unfinished save"]
    try:
        manifest.read(path)
    except (OSError, ValueError) as err:
        return [f"{path}: manifest unreadable: {err}"]
    return checksum.verify_checkpoint(path)  # every leaf read and checked against its checksums
