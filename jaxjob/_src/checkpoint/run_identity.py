"""A run's identity: one id per ``db_prefix``, recorded in every checkpoint saved under it.

The id is a random hex string in ``<db_prefix>/.jaxjob/run.json``, created by
the first save (:func:`ensure`) and never changed; every manifest records the
id of the run that saved it. A checkpoint directory copied in from another
run's db_prefix (the same node and epoch name, other bytes) is then refused
when read through this db_prefix (:func:`check`), instead of restoring as
this run's. A checkpoint directory read alone is not checked: it names no
db_prefix.

A db_prefix without the file (copied without its hidden ``.jaxjob`` folder,
which also holds the writers' locks) checks nothing, and its next save
adopts the run of its newest committed checkpoint, so its own checkpoints
stay readable.
"""

from __future__ import annotations

import json
import uuid

from jaxjob._src.base import fs
from jaxjob._src.checkpoint import checksum, manifest, schema
from jaxjob._src.checkpoint.layout import db_name, get_ckpt_filename, is_committed, parse_name

__all__ = ["RUN_DIR", "RUN_FILE", "check", "ensure", "read", "run_file"]

RUN_DIR = ".jaxjob"  # the folder of the writers' locks (jaxjob._src.manager.lock.LOCK_DIR)
RUN_FILE = "run.json"
_ATTEMPTS = 3  # creations raced by a lock release removing the folder


def run_file(db_prefix: str) -> str:
    """The file holding the run id of ``db_prefix``.

    Example:
        >>> run_file("/ckpt")
        '/ckpt/.jaxjob/run.json'
    """
    return fs.join(db_prefix, RUN_DIR, RUN_FILE)


def read(db_prefix: str) -> str | None:
    """The run id of ``db_prefix``, or None if it has none yet.

    Raises:
        ValueError: If the run file is damaged (naming it and how to fix it).
    """
    file = run_file(db_prefix)
    try:
        text = fs.read_text(file)
    except FileNotFoundError:
        return None
    try:
        run = json.loads(text).get("run")
    except (ValueError, AttributeError):
        run = None
    if not isinstance(run, str) or not schema.RUN_ID.fullmatch(run):
        raise ValueError(
            f"the run file {file!r} is damaged ({text[:80]!r}); remove it: the next save "
            "writes it again with the run of the newest committed checkpoint"
        )
    return run


def ensure(db_prefix: str) -> str:
    """The run id of ``db_prefix``, created if it has none (atomically: one id whoever races).

    Call it on every process that saves; the processes of one job get the same id.

    Example:
        >>> import tempfile
        >>> prefix = tempfile.mkdtemp()
        >>> run = ensure(prefix)
        >>> ensure(prefix) == run == read(prefix), len(run)
        (True, 32)
    """
    for _ in range(_ATTEMPTS):
        run = read(db_prefix)
        if run is not None:
            return run
        fs.makedirs(fs.join(db_prefix, RUN_DIR))
        try:
            fs.create_only(run_file(db_prefix), json.dumps({"run": _adopted(db_prefix)}))
        except FileNotFoundError:  # the last lock's release removed the folder: again
            continue
    raise OSError(f"could not create the run file {run_file(db_prefix)!r}: its folder vanishes")


def _adopted(db_prefix: str) -> str:
    """The run of the newest committed checkpoint under ``db_prefix`` that reads; else a new id."""
    entries = [e for n in fs.listdir(db_prefix) if (e := parse_name(n)) and not e.tmp]
    for entry in sorted(entries, key=lambda e: e.epoch, reverse=True):
        path = fs.join(db_prefix, get_ckpt_filename(entry.node, entry.epoch))
        if not is_committed(path):
            continue
        try:
            return manifest.read(path).run
        except (OSError, ValueError):
            continue
    return uuid.uuid4().hex


def check(found: manifest.Manifest, db_prefix: str) -> None:
    """Refuses a checkpoint of ``db_prefix`` that another run saved (a copied directory).

    Nothing is checked while ``db_prefix`` has no run id.

    Raises:
        CorruptCheckpointError: Naming the checkpoint, both runs and the run file.
        ValueError: If the run file is damaged.
    """
    run = read(db_prefix)
    if run is None or found.run == run:
        return
    raise checksum.corrupt(
        found.epoch,
        db_name(found.epoch, found.node, db_prefix),
        f"it was saved by run {found.run}, but {db_prefix!r} is run {run} "
        f"({run_file(db_prefix)}): a checkpoint directory copied from another run; restore "
        "it as a directory of its own, or restore another epoch",
    )
