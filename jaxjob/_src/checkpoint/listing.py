"""What a ``db_prefix`` holds: one row per checkpoint directory, committed or not."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import time
from typing import Any

from jaxjob._src.base import fs
from jaxjob._src.checkpoint.layout import is_committed, parse_name
from jaxjob._src.checkpoint.run_identity import RUN_DIR
from jaxjob._src.internals import orbax_files

__all__ = ["TIERS_FILE", "CheckpointInfo", "list_checkpoints", "list_tiers", "record_local_tier"]

TIERS_FILE = "tiers.json"  # in <db_prefix>/.jaxjob/: where the run's local tier is


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
        tier: ``"persistent"`` (the db_prefix) or ``"local:<process>"`` (that
            process's local-tier directory on this machine).
    """

    node: str
    epoch: int
    committed: bool
    path: str
    size_bytes: int
    save_s: float | None
    committed_at: float | None
    tier: str = "persistent"

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


def record_local_tier(db_prefix: str, template: str) -> None:
    """Records in ``db_prefix`` where its run's local tier is (``template``: with ``{process}``)."""
    fs.makedirs(fs.join(db_prefix, RUN_DIR))
    fs.write_text(fs.join(db_prefix, RUN_DIR, TIERS_FILE), json.dumps({"local": template}))


def _local_dirs(db_prefix: str) -> list[tuple[int, str]]:
    """``(process, directory)`` of the recorded local tier's directories on this machine."""
    try:
        recorded = json.loads(fs.read_text(fs.join(db_prefix, RUN_DIR, TIERS_FILE)))
        template = recorded["local"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(template, str):
        return []
    if "{process}" not in template:
        return [(0, template)] if os.path.isdir(template) else []
    found = []
    pattern = re.escape(template).replace(re.escape("{process}"), "([0-9]+)")
    for path in glob.glob(template.replace("{process}", "*")):
        match = re.fullmatch(pattern, path)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def list_tiers(db_prefix: str) -> list[CheckpointInfo]:
    """:func:`list_checkpoints` of ``db_prefix``, then of its run's local tier on this machine.

    The local tier's directories (one per process, recorded by the run's
    first local save in ``<db_prefix>/.jaxjob/tiers.json``) that exist here
    add their rows, with ``tier`` ``"local:<process>"``.

    Raises:
        FileNotFoundError: If neither tier holds a checkpoint directory.
    """
    prefix = fs.normalize(db_prefix, "db_prefix")
    try:
        rows = list_checkpoints(prefix)
    except FileNotFoundError:
        rows = []
    for process, directory in _local_dirs(prefix):
        try:
            local = list_checkpoints(directory)
        except FileNotFoundError:
            continue
        rows += [dataclasses.replace(r, tier=f"local:{process}") for r in local]
    if not rows:
        raise FileNotFoundError(f"no checkpoint directories under {prefix!r}")
    return rows
