"""Where checkpoints live: ``<db_prefix>/<node>.<epoch>/`` and which of them are committed."""

from __future__ import annotations

import os
import re

import orbax.checkpoint as ocp

__all__ = ["committed_epochs", "db_name", "get_ckpt_filename", "is_committed"]

MANIFEST_ITEM = "jaxjob"


def get_ckpt_filename(node_name: str, epoch: int) -> str:
    """Returns the checkpoint directory name ``<node_name>.<epoch>``.

    Example:
        >>> get_ckpt_filename("trainer_0", 3)
        'trainer_0.3'
    """
    return f"{node_name}.{epoch}"


def db_name(epoch: int, node_name: str, db_prefix: str, path_prefix: str | None = None) -> str:
    """Returns the checkpoint directory of ``node_name`` at ``epoch``.

    With ``path_prefix`` the name is ``path_prefix + "<node>.<epoch>"`` (plain
    concatenation, as in the seed); otherwise ``<db_prefix>/<node>.<epoch>``.

    Example:
        >>> db_name(5, "trainer_0", "/ckpt")
        '/ckpt/trainer_0.5'
        >>> db_name(5, "trainer_0", "/ckpt", path_prefix="/other/run_")
        '/other/run_trainer_0.5'
    """
    if path_prefix:
        return path_prefix + get_ckpt_filename(node_name, epoch)
    return os.path.join(db_prefix, get_ckpt_filename(node_name, epoch))


def committed_epochs(db_prefix: str, node_name: str, path_prefix: str | None = None) -> list[int]:
    """Epochs of ``node_name`` whose checkpoint directory is fully committed, ascending.

    Temporary directories of saves in flight (or killed) are never listed.
    """
    template = db_name(0, node_name, db_prefix, path_prefix)
    directory, base = os.path.split(template)
    pattern = re.compile(re.escape(base[:-1]) + r"(\d+)")
    try:
        entries = os.listdir(directory or ".")
    except (FileNotFoundError, NotADirectoryError):
        return []
    epochs = []
    for entry in entries:
        match = pattern.fullmatch(entry)
        full = os.path.join(directory, entry)
        if match and is_committed(full):
            epochs.append(int(match.group(1)))
    return sorted(epochs)


def is_committed(path: str) -> bool:
    """Whether ``path`` is a jaxjob checkpoint that Orbax has finalized."""
    return os.path.isdir(os.path.join(path, MANIFEST_ITEM)) and ocp.utils.is_checkpoint_finalized(
        path
    )
