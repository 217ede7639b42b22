"""Where checkpoints live: ``<db_prefix>/<node>.<epoch>/`` and which of them are committed."""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from jaxjob._src.base import fs
from jaxjob._src.base.checks import is_int

__all__ = [
    "COMMIT_MARKER",
    "Entry",
    "check_epoch",
    "check_node_name",
    "committed_epochs",
    "common_epochs",
    "db_name",
    "get_ckpt_filename",
    "is_committed",
    "parse_name",
    "split_node_name",
]

COMMIT_MARKER = "commit_success.txt"  # Orbax's; written last, also by jaxjob's durable rename
# <node>.<epoch>, or Orbax's temporary directory of a save in flight: <node>.<epoch>.orbax-...
_ENTRY = re.compile(r"(?P<node>.+)\.(?P<epoch>\d+)(?P<tmp>\.orbax-checkpoint-tmp.*)?")


class Entry(NamedTuple):
    """A checkpoint directory's name, parsed (``tmp``: Orbax's temporary directory of a save)."""

    node: str
    epoch: int
    tmp: bool


def parse_name(name: str) -> Entry | None:
    """The node and epoch a directory name ``<node>.<epoch>[.orbax-checkpoint-tmp...]`` holds.

    The node is the longest prefix that leaves ``.<epoch>``: ``a.1.5`` is epoch
    5 of node ``a.1``.

    Returns:
        None if ``name`` is not a checkpoint directory's name.

    Example:
        >>> parse_name("trainer.1.5"), parse_name("local.3.orbax-checkpoint-tmp-9")
        (Entry(node='trainer.1', epoch=5, tmp=False), Entry(node='local', epoch=3, tmp=True))
        >>> parse_name("metadata.json") is None
        True
    """
    match = _ENTRY.fullmatch(name)
    if match is None:
        return None
    return Entry(match.group("node"), int(match.group("epoch")), match.group("tmp") is not None)


def split_node_name(name: str, node_name: str) -> tuple[int, str] | None:
    """The epoch and the suffix of a name ``<node_name>.<epoch><suffix>`` under a db_prefix.

    The suffix is empty for a checkpoint directory; a save in flight, a
    deletion or a superseded epoch adds one.

    Returns:
        None if ``name`` is not ``node_name`` 's.

    Example:
        >>> split_node_name("local.3.orbax-checkpoint-tmp-9", "local")
        (3, '.orbax-checkpoint-tmp-9')
        >>> split_node_name("local.3", "loc") is None
        True
    """
    prefix = f"{node_name}."
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if digits == 0:
        return None
    return int(rest[:digits]), rest[digits:]


def check_epoch(epoch: Any, argument: str = "epoch") -> int:
    """Returns ``epoch`` if it is an int >= 0 (a checkpoint's epoch).

    Raises:
        TypeError: If it is not an int (a bool is not one).
        ValueError: If it is negative.

    Example:
        >>> check_epoch(-1)
        Traceback (most recent call last):
        ...
        ValueError: epoch must be >= 0, got -1
    """
    if not is_int(epoch, numbers.Integral):
        raise TypeError(f"{argument} must be an int >= 0, got {epoch!r} ({type(epoch).__name__})")
    if epoch < 0:
        raise ValueError(f"{argument} must be >= 0, got {epoch!r}")
    return int(epoch)


def check_node_name(name: Any) -> str:
    r"""Returns ``name`` if it can name a node's checkpoint directory ``<node>.<epoch>``.

    Raises:
        TypeError: If it is not a ``str``.
        ValueError: If it is empty, ``.`` or ``..``, or holds ``/``, ``\`` or NUL.

    Example:
        >>> check_node_name("../x")
        Traceback (most recent call last):
        ...
        ValueError: node_name must be a plain directory name (...), got '../x'
    """
    if not isinstance(name, str):
        raise TypeError(f"node_name must be a str, got {name!r} ({type(name).__name__})")
    text = name
    if text in ("", ".", "..") or any(c in text for c in "/\\\0"):
        raise ValueError(
            "node_name must be a plain directory name (no '/', '\\' or NUL, not '.' or '..'), "
            f"got {text!r}"
        )
    return text


def get_ckpt_filename(node_name: str, epoch: int) -> str:
    """Returns the checkpoint directory name ``<node_name>.<epoch>``.

    Example:
        >>> import jaxjob
        >>> jaxjob.get_ckpt_filename("trainer_0", 3)
        'trainer_0.3'
    """
    return f"{check_node_name(node_name)}.{check_epoch(epoch)}"


def db_name(epoch: int, node_name: str, db_prefix: str, path_prefix: str | None = None) -> str:
    """Returns the checkpoint directory of ``node_name`` at ``epoch``.

    With ``path_prefix`` the name is ``path_prefix + "<node>.<epoch>"`` (plain
    concatenation, as in the seed); otherwise ``<db_prefix>/<node>.<epoch>``.

    Example:
        >>> import jaxjob
        >>> jaxjob.db_name(5, "trainer_0", "/ckpt")
        '/ckpt/trainer_0.5'
        >>> jaxjob.db_name(5, "trainer_0", "/ckpt", path_prefix="/other/run_")
        '/other/run_trainer_0.5'
    """
    if path_prefix:
        return path_prefix + get_ckpt_filename(node_name, epoch)
    return fs.join(db_prefix, get_ckpt_filename(node_name, epoch))


def committed_epochs(db_prefix: str, node_name: str, path_prefix: str | None = None) -> list[int]:
    """Epochs of ``node_name`` whose checkpoint directory is fully committed, ascending.

    Temporary directories of saves in flight (or killed) are never listed.
    """
    template = db_name(0, node_name, db_prefix, path_prefix)
    directory, _, base = template.rpartition("/")
    stem = base[: -len(".0")]  # the directory names' node part, with path_prefix's tail
    epochs = []
    for entry in fs.listdir(directory or "/"):
        parsed = parse_name(entry)
        if parsed is None or parsed.node != stem or parsed.tmp:
            continue
        if is_committed(fs.join(directory, entry)):
            epochs.append(parsed.epoch)
    return sorted(epochs)


def common_epochs(
    db_prefix: str, node_names: Iterable[str], path_prefix: str | None = None
) -> list[int]:
    """Epochs committed for every node of ``node_names``, ascending (none without nodes)."""
    common: set[int] | None = None
    for node in node_names:
        found = set(committed_epochs(db_prefix, node, path_prefix))
        common = found if common is None else common & found
    return sorted(common or ())


def is_committed(path: str) -> bool:
    """Whether the checkpoint directory ``path`` is committed (its commit marker exists).

    Orbax writes the marker last: on local disk inside the temporary
    directory before renaming it to ``path``, on object stores into ``path``.
    """
    return fs.exists(fs.join(path, COMMIT_MARKER))
