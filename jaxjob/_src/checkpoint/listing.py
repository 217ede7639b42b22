"""What a ``db_prefix`` holds: one row per checkpoint directory, committed or not."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from jaxjob._src.base import fs
from jaxjob._src.checkpoint.layout import is_committed, parse_name
from jaxjob._src.internals import orbax_files

__all__ = ["CheckpointInfo", "list_checkpoints"]


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint directory under a ``db_prefix``.

    Attributes:
        node: The node name.
        epoch: The epoch.
        committed: Whether it is committed (listed, resumable).
        path: The directory.
        size_bytes: Bytes of its files.
        save_s: Seconds from the start of its save to its commit, if known.
        committed_at: When it was committed (seconds since the epoch), if known.
    """

    node: str
    epoch: int
    committed: bool
    path: str
    size_bytes: int
    save_s: float | None
    committed_at: float | None

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-serializable dict, with its ``age_s``."""
        age = None if self.committed_at is None else time.time() - self.committed_at
        return {**dataclasses.asdict(self), "age_s": age}


def list_checkpoints(db_prefix: str) -> list[CheckpointInfo]:
    """Every checkpoint directory under ``db_prefix``, sorted by node and epoch.

    Raises:
        FileNotFoundError: If ``db_prefix`` holds no checkpoint directory.

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxjob
        >>> prefix = tempfile.mkdtemp()
        >>> ckpt = jaxjob.CheckpointManager(prefix)
        >>> ckpt.save(0, {"w": jnp.ones(3)})
        >>> ckpt.close()
        >>> [(row.node, row.epoch, row.committed) for row in list_checkpoints(prefix)]
        [('local', 0, True)]
    """
    prefix = fs.normalize(db_prefix, "db_prefix")
    rows = []
    for entry in fs.listdir(prefix):
        parsed = parse_name(entry)
        path = fs.join(prefix, entry)
        if not parsed or not fs.is_dir(path):
            continue
        committed = not parsed.tmp and is_committed(path)
        started, commit = orbax_files.commit_times(path)
        save_s = commit - started if started and commit and committed else None
        rows.append(
            CheckpointInfo(
                parsed.node, parsed.epoch, committed, path, fs.size(path), save_s, commit
            )
        )
    if not rows:
        raise FileNotFoundError(f"no checkpoint directories under {prefix!r}")
    return sorted(rows, key=lambda r: (r.node, r.epoch, not r.committed))
