"""A run's identity: one id per ``db_prefix``, recorded in every checkpoint saved under it.

The id is a random hex string in ``<db_prefix>/.jaxjob/run.json``, created by
the first save (:func:`ensure`) and never changed; every manifest records the
id of the run that saved it, and every commit record of the metadata log
(``<db_prefix>/jaxjob_metadata.jsonl``) names it too. A checkpoint directory
copied in from another run's db_prefix (the same node and epoch name, other
bytes) is then refused when read through this db_prefix (:func:`check`),
also when read alone from inside it (:func:`holding_prefix`).

**The lineage rule.** A prefix's run is, in this order: its run file; else
the run named by the last commit record of its metadata log; else the run
that every committed manifest under it names. When the manifests name several
runs and neither file is there to decide, nothing is guessed (not by
majority, not by recency): reading and resuming through the prefix raise a
:class:`LineageError` naming the runs and their checkpoints. A checkpoint
whose manifest names another run than its prefix's is refused everywhere.
The next save re-creates a missing run file from that evidence (a new id
only when there is none).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

from jaxjob._src.base import fs
from jaxjob._src.checkpoint import checksum, manifest, schema
from jaxjob._src.checkpoint.layout import db_name, get_ckpt_filename, is_committed, parse_name

__all__ = [
    "LOG_FILE",
    "RUN_DIR",
    "RUN_FILE",
    "LineageError",
    "check",
    "ensure",
    "evidence",
    "holding_prefix",
    "prefix_run",
    "read",
    "run_file",
]

RUN_DIR = ".jaxjob"  # the folder of the writers' locks (jaxjob._src.manager.lock.LOCK_DIR)
RUN_FILE = "run.json"
LOG_FILE = "jaxjob_metadata.jsonl"  # the metadata log (jaxjob.DiskMetadataHandler), at the top
_LOG_TAIL = 1 << 16  # bytes: the log's end holds its last commit records


class LineageError(ValueError):
    """The checkpoints under a db_prefix name several runs, and no run file or log decides.

    Resuming and restoring through that prefix refuse rather than guess; the
    message names the runs, their checkpoints and how to fix it.
    """

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.LineageError

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X


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
    """The run the evidence under ``db_prefix`` names (:func:`prefix_run`); else a new id."""
    return prefix_run(db_prefix) or uuid.uuid4().hex


def _committed(db_prefix: str) -> Iterator[str]:
    """The committed ``<node>.<epoch>`` directories under ``db_prefix``, newest epoch first."""
    try:
        names = fs.listdir(db_prefix)
    except FileNotFoundError:
        return
    entries = [(e, n) for n in names if (e := parse_name(n)) and not e.tmp]
    for entry, _ in sorted(entries, key=lambda pair: (pair[0].epoch, pair[1]), reverse=True):
        path = fs.join(db_prefix, get_ckpt_filename(entry.node, entry.epoch))
        if is_committed(path):
            yield path


def _logged(db_prefix: str) -> str | None:
    """The run named by the last commit record of the metadata log that names one."""
    text = _log_tail(fs.join(db_prefix, LOG_FILE))
    for line in reversed((text or "").splitlines()):
        try:
            run = json.loads(line).get("run")
        except (ValueError, AttributeError):
            continue
        if isinstance(run, str) and schema.RUN_ID.fullmatch(run):
            return run
    return None


def _log_tail(file: str) -> str | None:
    """The end of the metadata log (its last :data:`_LOG_TAIL` bytes on disk), None if none.

    On disk only a regular file is read (a log replaced by ``/dev/full`` or
    ``/dev/zero`` is not one); bytes that are not UTF-8 read as U+FFFD, so
    the lines they are on do not parse.
    """
    if fs.is_remote(file):
        try:
            return fs.read_bytes(file).decode(errors="replace")
        except FileNotFoundError:
            return None
    if not os.path.isfile(file):
        return None
    with open(file, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - _LOG_TAIL))
        return f.read().decode(errors="replace")


def _manifest_runs(db_prefix: str) -> dict[str, list[str]]:
    """Run -> the committed checkpoints under ``db_prefix`` whose manifests name it."""
    runs: dict[str, list[str]] = {}
    for path in _committed(db_prefix):
        try:
            runs.setdefault(manifest.read(path).run, []).append(path)
        except (OSError, ValueError):  # damaged: its own reads say so
            continue
    return runs


def evidence(db_prefix: str) -> tuple[str | None, str]:
    """The run of ``db_prefix`` by the lineage rule (see the module), and where it is recorded.

    Returns:
        ``(run, source)``: ``run`` None (and ``source`` empty) when there is no
        evidence yet (no run file, no logged run, no committed checkpoint).

    Raises:
        LineageError: If the manifests name several runs and neither the run
            file nor the metadata log is there to decide.
        ValueError: If the run file is damaged.
    """
    run = read(db_prefix)
    if run is not None:
        return run, run_file(db_prefix)
    run = _logged(db_prefix)
    if run is not None:
        return run, f"the metadata log {fs.join(db_prefix, LOG_FILE)}"
    runs = _manifest_runs(db_prefix)
    if len(runs) == 1:
        ((run, paths),) = runs.items()
        return run, f"the manifests of {len(paths)} committed checkpoint(s), its run file missing"
    if not runs:
        return None, ""
    named = "; ".join(f"run {r}: {[p.rpartition('/')[2] for p in ps]}" for r, ps in runs.items())
    raise LineageError(
        f"the checkpoints under {db_prefix!r} were saved by {len(runs)} runs ({named}), and "
        f"neither its run file {run_file(db_prefix)!r} nor a run in its metadata log "
        f"{fs.join(db_prefix, LOG_FILE)!r} says which is this prefix's: jaxjob does not guess. "
        "Move the checkpoint directories of the other run(s) out of it (or write the run file "
        'by hand: {"run": "<id>"}), then resume'
    )


def prefix_run(db_prefix: str) -> str | None:
    """The run of ``db_prefix`` by the lineage rule; None without evidence (:func:`evidence`).

    Example:
        >>> import tempfile
        >>> prefix = tempfile.mkdtemp()
        >>> prefix_run(prefix) is None
        True
        >>> ensure(prefix) == prefix_run(prefix)
        True
    """
    return evidence(db_prefix)[0]


def holding_prefix(path: str) -> str | None:
    """The db_prefix holding the checkpoint directory ``path``, or None (a directory of its own).

    That is its parent, when ``path`` is named ``<node>.<epoch>`` and the
    parent has a run file, a metadata log, or another committed checkpoint.
    """
    parent, _, base = path.rstrip("/").rpartition("/")
    if not parent or parse_name(base) is None:
        return None
    if fs.exists(run_file(parent)) or fs.exists(fs.join(parent, LOG_FILE)):
        return parent
    others = (p for p in _committed(parent) if p.rstrip("/").rpartition("/")[2] != base)
    return parent if next(others, None) is not None else None


def check(found: manifest.Manifest, db_prefix: str) -> None:
    """Refuses a checkpoint of ``db_prefix`` that another run saved (a copied directory).

    The prefix's run is decided by its evidence (:func:`evidence`); nothing
    is checked while there is none.

    Raises:
        CorruptCheckpointError: Naming the checkpoint, both runs and the evidence.
        LineageError: If the prefix's evidence names several runs.
        ValueError: If the run file is damaged.
    """
    run, source = evidence(db_prefix)
    if run is None or found.run == run:
        return
    raise checksum.corrupt(
        found.epoch,
        db_name(found.epoch, found.node, db_prefix),
        f"it was saved by run {found.run}, but {db_prefix!r} is run {run} ({source}): a "
        "checkpoint directory copied from another run; copy it out of this db_prefix to "
        "restore it as a directory of its own, or restore another epoch",
    )
