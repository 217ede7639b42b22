"""Checksums of a checkpoint's stored leaves, computed while saving and checked on every read.

When a checkpoint is saved, each process takes the host copy of every
shard it writes (its replica-0 shards of each ``jax.Array``, its host-local
rows, or, in a private checkpoint, whole NumPy arrays) and hashes it with
CRC-32C in a background thread (:func:`digest`): on local disk while the
commit flushes the written files (the CPU waits on the disk then; hashed
while Orbax wrote, the hash took CPU and memory bandwidth from the write),
elsewhere while Orbax writes. Its records go to
``<checkpoint>/jaxjob/checksums.<process>.json`` (which carries its own
checksum) before the checkpoint commits; the manifest names those files and
carries its own checksum too. The logical bytes are hashed, not the files,
so a damaged file is caught whatever Orbax's storage format (OCDBT, zarr,
compression): either its bytes decode to other values, whose checksum
differs, or they do not decode, which is reported the same way. Every file
of the checkpoint also has a CRC-32C of its stored bytes in the file table
(:mod:`jaxjob._src.checkpoint.files`), written at the commit.

Reading checks what is read: a restore compares every shard it reads
against its record; :mod:`jaxjob._src.checkpoint.leaf_check` reads leaves back and checks them.
Either names the leaf, the epoch and the file. Nothing read here is
executed: the records are JSON numbers and index ranges.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import crc32c, file_table, fs
from jaxjob._src.base.errors import CorruptCheckpointError
from jaxjob._src.checkpoint import keypaths

__all__ = ["ALGORITHM", "describe", "digest", "doc_checksum", "mismatches", "read_records"]

ALGORITHM = crc32c.NAME
SELF_KEY = file_table.SELF_KEY
FILE_NAME = re.compile(r"checksums\.[0-9]+\.json")
Index = tuple[tuple[int, int], ...]
Record = tuple[Index, int, int, str]  # (index ranges, crc, saving process, dtype of the bytes)

_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxjob-crc")


def digest(array: np.ndarray) -> int:
    """The checksum of an array's bytes in C order: their CRC-32C (:mod:`jaxjob._src.base.crc32c`).

    Example:
        >>> import numpy as np
        >>> a = np.arange(5000, dtype=np.float32)
        >>> b = a.copy(); b[2500] += 1
        >>> digest(a) == digest(a.copy()), digest(a) == digest(b)
        (True, False)
    """
    return crc32c.of_array(array)


def doc_checksum(doc: Mapping[str, Any]) -> int:
    """The CRC-32C of a JSON document's canonical text, without its own ``self_checksum``."""
    return file_table.doc_checksum(doc)


def checksums_file(process: int) -> str:
    """The name of process ``process``'s checksum file, beside the manifest."""
    return f"checksums.{process}.json"


def _index(index: tuple[slice, ...], shape: tuple[int, ...]) -> Index:
    return tuple(s.indices(d)[:2] for s, d in zip(index, shape, strict=True))


def host_shards(
    value: Any, *, every_replica: bool = False, first_replica: bool = False
) -> list[tuple[Index, np.ndarray]]:
    """The host copies of the shards of a stored leaf that this process holds.

    Args:
        value: A stored leaf (a ``jax.Array``, a NumPy array or a scalar).
        every_replica: Every shard this process holds; False: only those it
            writes (replica 0).
        first_replica: Those of the replica of this process's first shard
            (what a process writing its local-tier copy alone writes).
    """
    if isinstance(value, jax.Array):
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        shards = value.addressable_shards
        replica = shards[0].replica_id if first_replica and shards else 0
        return [
            (_index(s.index, value.shape), np.asarray(s.data))
            for s in shards
            if every_replica or s.replica_id == replica
        ]
    array = np.asarray(value)
    return [(tuple((0, d) for d in array.shape), array)]


def _compute(shards: dict[str, list[tuple[Index, np.ndarray]]]) -> dict[str, list[Any]]:
    return {
        name: [[[list(r) for r in index], digest(data), data.dtype.name] for index, data in found]
        for name, found in shards.items()
    }


class Checksums:
    """This process's shard checksums: hashed in the background once asked for.

    The host copies are taken when the save starts (:func:`start`); the hash
    starts at :meth:`start` or at the first :meth:`result`.
    """

    def __init__(self, shards: dict[str, list[tuple[Index, np.ndarray]]]) -> None:
        self._shards: dict[str, list[tuple[Index, np.ndarray]]] | None = shards
        self._future: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    def start(self) -> concurrent.futures.Future:
        """Starts hashing in the background (once); the future of its records."""
        with self._lock:
            if self._future is None:
                self._future = _executor.submit(_compute, self._shards)
                self._shards = None  # the hash holds them until it is done
            return self._future

    def result(self) -> dict[str, list[Any]]:
        """The JSON records (stored name -> ``[[index ranges], crc, dtype]`` list)."""
        return self.start().result()


def start(encoded: Mapping[str, Mapping[str, Any]], *, first_replica: bool = False) -> Checksums:
    """Takes the host copies of what this process writes, to be hashed in the background.

    ``first_replica``: a local-tier copy (see :func:`host_shards`).

    Returns:
        Their checksums, once asked for: stored name -> ``[[index ranges], crc, dtype]``
        lists (the dtype of the bytes hashed, so that bytes read as another dtype of the
        same size, as a re-signed manifest could declare, do not pass).
    """
    shards = {
        name: host_shards(v, first_replica=first_replica)
        for leaves in encoded.values()
        for name, v in leaves.items()
    }
    return Checksums(shards)


def _declared(leaves: Any) -> dict[str, list[Any]]:
    """Stored name -> ``[dtype, shape]`` as a manifest's leaf entries declare them."""
    return {e["name"]: [e["dtype"], list(e["shape"])] for e in leaves}


def records_text(future: Checksums, epoch: int, declared: Mapping[str, Any] | None = None) -> str:
    """The checksum file of this process, once its checksums are computed.

    ``declared`` (stored name -> ``[dtype, shape]``, the manifest's) is kept
    beside the records: a manifest re-signed on its own to read the same
    bytes as another dtype or shape no longer matches it.
    """
    doc = {"algorithm": ALGORITHM, "epoch": epoch, "process": jax.process_index()}
    doc["declared"] = dict(declared or {})
    doc["leaves"] = future.result()
    doc[SELF_KEY] = doc_checksum(doc)
    return json.dumps(doc)


class PendingManifest(dict):
    """A manifest document whose process's checksum file is written once computed."""

    def __init__(self, doc: Mapping[str, Any], future: Checksums, epoch: int):
        super().__init__(doc)
        self.checksums = future
        self.epoch = epoch

    def checksum_file(self) -> tuple[str, str]:
        """This process's checksum file: its name and text (waits for the checksums)."""
        declared = _declared(self["leaves"])
        return checksums_file(jax.process_index()), records_text(
            self.checksums, self.epoch, declared
        )


# ---- reading ------------------------------------------------------------------------------


def corrupt(epoch: int, path: str, what: str) -> CorruptCheckpointError:
    """The error for a damaged checkpoint, naming its epoch and directory."""
    return CorruptCheckpointError(f"the checkpoint of epoch {epoch} at {path!r} is corrupt: {what}")


def _load_doc(file: str, epoch: int, path: str) -> dict[str, Any]:
    try:
        doc = json.loads(fs.read_text(file))
    except FileNotFoundError:
        raise corrupt(epoch, path, f"the checksum file {file!r} is missing") from None
    except ValueError as err:
        raise corrupt(epoch, path, f"the checksum file {file!r} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get(SELF_KEY) != doc_checksum(doc):
        raise corrupt(epoch, path, f"the checksum file {file!r} fails its own checksum")
    return doc


def read_records(path: str, found: Any) -> dict[str, list[Record]]:
    """Every process's checksum records of the checkpoint ``path``, by stored name.

    Raises:
        CorruptCheckpointError: If a checksum file is missing or damaged, or
            the manifest records none (every format-3 checkpoint has them).
    """
    if found.checksums is None:
        raise corrupt(
            found.epoch,
            path,
            "the manifest records no checksums (every manifest since format 4 does): it was "
            "edited or written by another tool, so no leaf can be checked; save the epoch again",
        )
    records: dict[str, list[Record]] = {}
    for name in found.checksums.get("files", []):
        if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
            raise corrupt(found.epoch, path, f"the manifest names a checksum file {name!r}")
        file = fs.join(path, "jaxjob", name)
        doc = _load_doc(file, found.epoch, path)
        if doc.get("algorithm") != ALGORITHM:
            raise corrupt(
                found.epoch,
                path,
                f"{file!r} uses checksum {doc.get('algorithm')!r}, not {ALGORITHM}",
            )
        _check_declared(doc.get("declared"), found, file, path)
        try:
            for leaf, entries in doc["leaves"].items():
                for index, crc, dtype in entries:
                    ranges = tuple((int(a), int(b)) for a, b in index)
                    record = (ranges, int(crc), int(doc["process"]), str(dtype))
                    records.setdefault(leaf, []).append(record)
        except (KeyError, TypeError, ValueError) as err:
            what = f"the checksum file {file!r} is malformed: {err}"
            raise corrupt(found.epoch, path, what) from None
    return records


def _check_declared(declared: Any, found: Any, file: str, path: str) -> None:
    """Raises unless the manifest declares each leaf as the checksum file says it was saved."""
    now = _declared(spec.to_json() for spec in found.leaves.values())
    if declared == now:
        return
    if not isinstance(declared, dict):
        raise corrupt(found.epoch, path, f"the checksum file {file!r} declares no leaves")
    differ = sorted(n for n in set(now) | set(declared) if now.get(n) != declared.get(n))
    what = ", ".join(
        f"{n}: saved as {declared.get(n)}, the manifest says {now.get(n)}" for n in differ[:5]
    )
    raise corrupt(
        found.epoch, path, f"the manifest does not declare its leaves as they were saved ({what})"
    )


def data_location(path: str, item: str, name: str, process: int | None) -> str:
    """The data files holding stored leaf ``name`` (of ``process``), else its directory.

    In an OCDBT checkpoint the files come from TensorStore's dump of the
    database's B-tree; if that cannot be read, the database directory.
    """
    files = _ocdbt_files(fs.join(path, item)).get(name, set())
    mine = {f for f in files if process is not None and f"/ocdbt.process_{process}/" in f}
    if mine or files:
        return ", ".join(sorted(mine or files))
    ocdbt = fs.join(path, item, f"ocdbt.process_{process or 0}")
    if fs.exists(ocdbt):
        return ocdbt
    plain = fs.join(path, item, name)
    return plain if fs.exists(plain) else fs.join(path, item)


def _ocdbt_files(directory: str) -> dict[str, set[str]]:
    """Stored name -> the files of the OCDBT database at local ``directory`` holding its chunks."""
    if fs.is_remote(directory) or not fs.exists(fs.join(directory, "manifest.ocdbt")):
        return {}
    import tensorstore as ts

    files: dict[str, set[str]] = {}
    try:
        base = ts.KvStore.open({"driver": "file", "path": directory + "/"}).result()
        versions = ts.ocdbt.dump(base).result()["versions"]
        nodes = [versions[-1]["root"]["location"]] if versions else []
        while nodes:
            location = nodes.pop()
            for entry in ts.ocdbt.dump(base, location).result().get("entries", []):
                # <stored name>/<zarr chunk or .zarray>: no stored name is another's directory
                name = str(entry.get("key", "")).removeprefix("b'").rpartition("/")[0]
                if "indirect_value" in entry:  # value:<prefix>:<file>:<offset>:<length>
                    _, prefix, file = entry["indirect_value"].split(":")[:3]
                    files.setdefault(name, set()).add(fs.join(directory, prefix + file))
                elif "inline_value" in entry:  # btreenode::<file>:<offset>:<length>
                    node_file = location.split("::", 1)[1].rsplit(":", 2)[0]
                    files.setdefault(name, set()).add(fs.join(directory, node_file))
                nodes += [v for v in entry.values() if str(v).startswith("btreenode::")]
    except Exception:  # only locates files for an error message: the directory is named instead
        return {}
    return files


def _contains(outer: Index, inner: Index) -> bool:
    if len(outer) != len(inner):
        return False
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner, strict=True))


def mismatches(value: Any, records: Iterable[Record]) -> tuple[list[Record], int]:
    """The records whose shard this process holds in ``value`` and whose checksum differs.

    Returns:
        The mismatching records and how many records were checked.
    """
    pieces = host_shards(value, every_replica=True)
    records = list(records)
    if pieces and any(r[3] != pieces[0][1].dtype.name for r in records):
        return records, len(records)  # read as another dtype than was hashed: a crafted manifest
    bad, checked = [], 0
    for record in records:
        ranges, crc, _, _ = record
        for index, data in pieces:
            if _contains(index, ranges):
                local = tuple(
                    slice(c - a, d - a) for (a, _), (c, d) in zip(index, ranges, strict=True)
                )
                checked += 1
                if digest(data[local]) != crc:
                    bad.append(record)
                break
    return bad, checked


def uncovered(value: Any, records: Iterable[Record]) -> list[str]:
    """The shards of ``value`` this process holds that no record covers, as ``"a:b, c:d"``."""
    records = list(records)
    return [
        ", ".join(f"{a}:{b}" for a, b in index)
        for index, _ in host_shards(value, every_replica=True)
        if not any(_contains(index, ranges) for ranges, *_ in records)
    ]


def key_path(found: Any, item: str, stored: str) -> str:
    """The ``/``-joined key path of the stored leaf ``stored`` (``params/0/w``)."""
    for name, structure in found.structure(item).items():
        for segments, leaf in keypaths.leaf_names(structure):
            if leaf == stored:
                return keypaths.join((name, *segments))
    return stored


def describe(path: str, item: str, spec: Any, found: Any, record: Record | None, why: str) -> str:
    """One line naming a damaged leaf (its ``/``-joined key path), its epoch and file."""
    process = record[2] if record is not None else None
    where = data_location(path, item, spec.name, process)
    shard = ""
    if record is not None:
        shard = " (shard " + ", ".join(f"{a}:{b}" for a, b in record[0]) + f" of process {process})"
    key = key_path(found, item, spec.name)
    stored = "" if spec.name == key else f", stored as {spec.name}"  # escaped, or ~N added
    return f"leaf {key} ({spec.path}{stored}) of epoch {found.epoch} in {where!r}{shard}: {why}"
