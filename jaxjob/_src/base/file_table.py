"""A directory's table of its files: each one's size and checksums, written last, checked on read.

A checkpoint's committing process writes the table (``jaxjob/files.json`` in a
checkpoint, carrying its own CRC-32C) just before the commit marker, once
every other file is written: on local disk from the page cache, on an
object store from a listing and reads of the objects. It
also records the commit marker that follows it, whose text the committer
knows in advance.

Each file gets its CRC-32C, and a file of up to :data:`SHA_UP_TO` bytes also
its SHA-256. Why both: the formats inside a checkpoint end their records
with a CRC-32C of their own (OCDBT manifests and B-tree nodes), and the
CRC-32C of a record that ends in its own CRC-32C is one constant for every
record of that length, so another epoch's manifest of the same size would
pass a CRC-32C alone. Those records are small files; a large data file
holds leaf values, which every read also checks against their per-shard
CRC-32C (:mod:`jaxjob._src.checkpoint.checksum`).

What is covered: every file, by size, CRC-32C, and SHA-256 up to 64 KiB;
except data files (OCDBT ``d/`` files) over :data:`SIZE_ONLY_OVER` bytes,
which get their size only: hashing them again at the commit would read the
checkpoint a second time (on an object store, download it), and their bytes
are the leaves' values, which every read and ``verify`` check per shard
against the CRC-32C taken from the host copy while the write went on.

:func:`problems` checks a directory against its table: every listed file
must exist with its size and checksums (a restore skips the checksums of
large data files, whose values it checks as it reads them).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from jaxjob._src.base import crc32c, fs

__all__ = [
    "CHECKPOINT_TABLE",
    "SELF_KEY",
    "SIZE_ONLY_OVER",
    "is_data_file",
    "problems",
    "read",
    "table",
    "write",
]

CHECKPOINT_TABLE = "jaxjob/files.json"  # where a checkpoint directory keeps its table
SELF_KEY = "self_checksum"
SIZE_ONLY_OVER = 1 << 20  # bytes: a larger data file gets its size only
# Every file of a checkpoint that is not one of these is a data file (OCDBT's d/<hash> files,
# zarr chunk files of checkpoints written without OCDBT): leaf values, or OCDBT B-tree nodes.
_METADATA_NAMES = {
    "_CHECKPOINT_METADATA", "_METADATA", "_ROOT_METADATA", "_sharding", "manifest.ocdbt",
    "commit_success.txt", ".zarray", ".zattrs", ".zgroup", "zarr.json",
}  # fmt: skip
_METADATA_DIRS = ("jaxjob/", "array_metadatas/")
_CHUNK = 4 << 20  # bytes read at a time when hashing a file
SHA_UP_TO = 64 << 10  # bytes: smaller files also get a SHA-256 (see the module docstring)
ALGORITHM = "crc32c+sha256"
Entry = list[Any]  # [size, crc32c or None, sha256 hex or None]


def is_data_file(relative: str) -> bool:
    """Whether ``relative`` names a data file: not one of Orbax's, zarr's or jaxjob's metadata.

    Example:
        >>> is_data_file("state/ocdbt.process_0/d/" + "a" * 32), is_data_file("state/w/0.0")
        (True, True)
        >>> is_data_file("state/jaxjob/epochs_done/0"), is_data_file("jaxjob/manifest.json")
        (True, False)
        >>> is_data_file("state/_METADATA"), is_data_file("state/array_metadatas/process_0")
        (False, False)
    """
    name = relative.rpartition("/")[2]
    inside = relative.partition("/")[2]  # within an item: its leaves' stored names, any name
    return not (
        name in _METADATA_NAMES
        or relative.startswith(_METADATA_DIRS)
        or inside.startswith("array_metadatas/")
    )


def doc_checksum(doc: Mapping[str, Any]) -> int:
    """The CRC-32C of a JSON document's canonical text, without its own ``self_checksum``."""
    body = {k: v for k, v in doc.items() if k != SELF_KEY}
    return crc32c.of_bytes(json.dumps(body, sort_keys=True).encode())


def _sha(data: Any, size: int) -> str | None:
    return hashlib.sha256(data).hexdigest() if size <= SHA_UP_TO else None


def entry_of(data: bytes) -> Entry:
    """The table entry of a file holding ``data``.

    Example:
        >>> entry_of(b"123456789")[:2]
        [9, 3808858755]
    """
    return [len(data), crc32c.of_bytes(data), _sha(data, len(data))]


def hash_file(path: str) -> Entry:
    """The table entry of the local file ``path``, read in chunks (no map, no whole copy)."""
    crc, sha, size = 0, hashlib.sha256(), 0
    with open(path, "rb") as f:
        # a buffer no larger than the file (+1 to see its end in one read): a tiny checkpoint's
        # ~20 small files each zeroed a 4 MiB one, ~0.4 ms a file, most of a restore's check
        buffer = bytearray(min(_CHUNK, os.fstat(f.fileno()).st_size + 1))
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            crc = crc32c.of_bytes(view[:n], crc)
            if size + n <= SHA_UP_TO:
                sha.update(view[:n])
            size += n
    return [size, crc, sha.hexdigest() if size <= SHA_UP_TO else None]


def _size_only(relative: str, size: int) -> bool:
    """Whether the table records only the size of this file (a large data file)."""
    return is_data_file(relative) and size > SIZE_ONLY_OVER


def _local_table(directory: str) -> dict[str, Entry]:
    """The entry of every file under the local ``directory``, hashed concurrently."""
    sizes = fs.list_files(directory)
    pool = fs.flush_pool()
    jobs = {
        rel: pool.submit(hash_file, os.path.join(directory, rel))
        for rel, size in sizes.items()
        if not _size_only(rel, size)
    }
    return {
        rel: jobs[rel].result() if rel in jobs else [size, None, None]
        for rel, size in sorted(sizes.items())
    }


def _remote_table(directory: str) -> dict[str, Entry]:
    files = fs.list_files(directory)
    pool = fs.flush_pool()

    def entry(relative: str, size: int) -> Entry:
        if _size_only(relative, size):
            return [size, None, None]
        return entry_of(fs.read_bytes(fs.join(directory, relative)))

    jobs = {rel: pool.submit(entry, rel, size) for rel, size in files.items()}
    return {rel: job.result() for rel, job in sorted(jobs.items())}


def table(directory: str, *, skip: Callable[[str], bool] = lambda _: False) -> dict[str, Any]:
    """The file table of ``directory`` (files ``skip`` accepts left out), without writing it.

    Args:
        directory: A local directory or an object-store prefix.
        skip: Relative paths to leave out.
    """
    remote = fs.is_remote(directory)
    files = _remote_table(directory) if remote else _local_table(directory)
    return {
        "algorithm": ALGORITHM,
        "files": {rel: entry for rel, entry in files.items() if not skip(rel)},
    }


def write(
    directory: str,
    relative: str,
    doc: dict[str, Any],
    extra: Mapping[str, str],
    *,
    flush_file: bool = True,
) -> None:
    """Writes ``doc`` (from :func:`table`) as the new file ``directory/relative``, flushed.

    It lists the files to come in ``extra``.

    Args:
        directory: The directory the table describes.
        relative: Where the table goes, relative to ``directory``.
        doc: The table.
        extra: Files written after the table (the commit marker): relative
            path -> their exact text.
        flush_file: Whether to flush it (False: the caller flushes the whole
            directory afterwards).
    """
    files = dict(doc["files"])
    for rel, text in extra.items():
        files[rel] = entry_of(text.encode())
    out = {"algorithm": doc["algorithm"], "files": dict(sorted(files.items()))}
    out[SELF_KEY] = doc_checksum(out)
    path = fs.join(directory, relative)
    fs.makedirs(path.rpartition("/")[0])
    fs.write_new(path, json.dumps(out), flush_file=flush_file)


def read(directory: str, relative: str) -> dict[str, Entry]:
    """The files the table ``directory/relative`` lists.

    Raises:
        FileNotFoundError: If there is no table.
        ValueError: If it is not valid JSON, fails its own checksum or is malformed.
    """
    try:
        doc = json.loads(fs.read_text(fs.join(directory, relative)))
    except RecursionError:
        raise ValueError("it nests too deeply to be a file table") from None
    if not isinstance(doc, dict) or doc.get(SELF_KEY) != doc_checksum(doc):
        raise ValueError("it fails its own checksum")
    if doc.get("algorithm") != ALGORITHM or not isinstance(doc.get("files"), dict):
        raise ValueError(f"it is malformed (algorithm {doc.get('algorithm')!r})")
    files = doc["files"]
    for rel, entry in files.items():
        ok = isinstance(entry, list) and len(entry) == 3 and type(entry[0]) is int
        if (
            not ok
            or not (entry[1] is None or isinstance(entry[1], int))
            or not (entry[2] is None or isinstance(entry[2], str))
        ):
            raise ValueError(f"it is malformed at {rel!r}: {entry!r}")
    return files


def problems(
    directory: str,
    relative: str,
    *,
    data_up_to: int | None = None,
    name: Callable[[str, str], str] = lambda _, path: repr(path),
) -> dict[str, str]:
    """What differs between ``directory`` and its table: relative path -> a line; empty if intact.

    Args:
        directory: A directory with a table.
        relative: Where its table lies.
        data_up_to: Check the CRC of OCDBT data files up to this many bytes,
            only the size of larger ones; None: of every one.
        name: How a line names a file, from its relative and full path.
    """
    where = fs.join(directory, relative)
    try:
        files = read(directory, relative)
    except FileNotFoundError:
        return {relative: f"{name(relative, where)} is missing"}
    except (ValueError, IsADirectoryError, UnicodeDecodeError) as err:
        return {relative: f"{name(relative, where)} is damaged: {err}"}
    present = fs.list_files(directory)
    pool = fs.flush_pool()
    jobs = {
        rel: pool.submit(_file_problem, directory, rel, entry, present, data_up_to)
        for rel, entry in files.items()
        if rel != relative
    }
    found = {rel: job.result() for rel, job in sorted(jobs.items())}
    return {rel: f"{name(rel, fs.join(directory, rel))} {why}" for rel, why in found.items() if why}


def _file_problem(
    directory: str, rel: str, entry: Entry, present: Mapping[str, int], data_up_to: int | None
) -> str | None:
    size, crc, sha = entry
    path = fs.join(directory, rel)
    if rel not in present:
        return "is missing"
    if present[rel] != size:
        return f"has {present[rel]} bytes, not the {size} it was written with"
    if crc is None or (data_up_to is not None and is_data_file(rel) and size > data_up_to):
        return None
    try:
        found = entry_of(fs.read_bytes(path)) if fs.is_remote(path) else hash_file(path)
    except FileNotFoundError:
        return "is missing"
    if found[1:] != [crc, sha]:
        return "fails its checksum (its bytes changed since it was written)"
    return None
