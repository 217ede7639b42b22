"""The manifest of one checkpoint directory: what it holds and how to rebuild it.

The manifest is a JSON file, ``<checkpoint>/jaxjob/manifest.json``, written
with the checkpoint's arrays and committed with them. It holds the format
version, the epoch and node, how many processes saved it, the tree structure
of each persistent name (``state``) and of each saved stop-condition output
(``outputs``), and one :class:`~jaxjob._src.checkpoint.codec.LeafSpec` per stored leaf. It is
read once per load and passed down; nothing in it is executed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

import jax

from jaxjob._src.base import fs
from jaxjob._src.checkpoint import checksum, codec, keypaths

__all__ = ["FORMAT", "MANIFEST_FILE", "MANIFEST_ITEM", "Manifest", "build", "read"]

FORMAT = 3
MANIFEST_ITEM = "jaxjob"
MANIFEST_FILE = "manifest.json"
STATE = "state"
OUTPUTS = "outputs"


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What one checkpoint directory holds.

    Attributes:
        epoch: The epoch saved.
        node: The node saved.
        process_count: How many processes saved it.
        owner_process: The process that saved it alone, or None (every process).
        time: When the save started (seconds since the epoch).
        state: Persistent name -> JSON tree structure.
        outputs: Saved stop-condition output name -> JSON tree structure.
        leaves: Stored name -> :class:`~jaxjob._src.checkpoint.codec.LeafSpec`.
        metrics: Scalars that retention ranks by (:class:`jaxjob.keep.Best`),
            name -> value; read without reading any array.
        checksums: The checksum algorithm and the files holding each
            process's checksums (:mod:`jaxjob._src.checkpoint.checksum`); None for a
            checkpoint saved without them.
    """

    epoch: int
    node: str
    process_count: int
    owner_process: int | None
    time: float
    state: dict[str, Any]
    outputs: dict[str, Any]
    leaves: dict[str, codec.LeafSpec]
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    checksums: dict[str, Any] | None = None

    @property
    def state_keys(self) -> list[str]:
        """The persistent names, in order."""
        return list(self.state)

    @property
    def output_keys(self) -> list[str]:
        """The saved output names, in order."""
        return list(self.outputs)

    def structure(self, item: str) -> dict[str, Any]:
        """The names and structures of ``item`` (``"state"`` or ``"outputs"``)."""
        return self.state if item == STATE else self.outputs

    def specs(self, item: str, name: str) -> list[codec.LeafSpec]:
        """The leaves of ``name`` in ``item``, in order."""
        structure = self.structure(item)[name]
        return [self.leaves[n] for _, n in keypaths.leaf_names(structure)]

    def to_json(self) -> dict[str, Any]:
        """The JSON document stored in the checkpoint, carrying its own checksum."""
        doc = {
            "format": FORMAT,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "leaves": [spec.to_json() for spec in self.leaves.values()],
        }
        doc[checksum.SELF_KEY] = checksum.doc_checksum(doc)
        return doc

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Manifest:
        """Reads the JSON document of the checkpoint at ``where``.

        Raises:
            ValueError: If it is of another format or malformed.
        """
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(
                f"{where!r} has checkpoint format {found!r}; this jaxjob reads format {FORMAT} "
                "(write it again with this version of jaxjob)"
            )
        try:
            leaves = [codec.LeafSpec.from_json(e) for e in doc["leaves"]]
            return cls(
                epoch=int(doc["epoch"]),
                node=str(doc["node"]),
                process_count=int(doc["process_count"]),
                owner_process=None if doc["owner_process"] is None else int(doc["owner_process"]),
                time=float(doc["time"]),
                state=dict(doc[STATE]),
                outputs=dict(doc[OUTPUTS]),
                leaves={spec.name: spec for spec in leaves},
                metrics={str(k): float(v) for k, v in doc.get("metrics", {}).items()},
                checksums=None if doc.get("checksums") is None else dict(doc["checksums"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"the manifest of {where!r} is malformed: {err}") from None


def check_name(name: str) -> None:
    """Refuses a workspace name that reads as an unsafe path (the names jaxjob uses pass)."""
    parts = name.split("/")
    if "\0" in name or name.startswith("/") or "." in parts or ".." in parts:
        raise ValueError(
            f"workspace name {name!r} cannot be checkpointed: a saved name must not start "
            "with '/', hold NUL or have '.' or '..' between its '/'s; rename it"
        )


def build(
    epoch: int,
    node: str,
    state: Mapping[str, Any],
    outputs: Mapping[str, Any],
    owner_process: int | None,
) -> tuple[Manifest, dict[str, dict[str, Any]]]:
    """The manifest of a save, and each item's leaves by stored name.

    Raises:
        TypeError: Naming the key path of a leaf that cannot be checkpointed.
        ValueError: If a workspace name is unsafe as a path (``..``, absolute, NUL).
    """
    counter = itertools.count()
    structures: dict[str, dict[str, Any]] = {STATE: {}, OUTPUTS: {}}
    leaves: dict[str, codec.LeafSpec] = {}
    flat: dict[str, dict[str, Any]] = {STATE: {}, OUTPUTS: {}}
    for item, tree in ((STATE, state), (OUTPUTS, outputs)):
        for name, value in tree.items():
            check_name(name)
            structure, found = codec.flatten(value, f"[{name!r}]", counter)
            structures[item][name] = structure
            for stored, leaf, path in found:
                leaves[stored] = codec.LeafSpec.of(leaf, stored, path)
                flat[item][stored] = leaf
    writers = range(jax.process_count()) if owner_process is None else [owner_process]
    manifest = Manifest(
        epoch=epoch,
        node=node,
        process_count=jax.process_count(),
        owner_process=owner_process,
        time=time.time(),
        state=structures[STATE],
        outputs=structures[OUTPUTS],
        leaves=leaves,
        checksums={
            "algorithm": checksum.ALGORITHM,
            "files": [checksum.checksums_file(p) for p in writers],
        },
    )
    return manifest, flat


def read(path: str) -> Manifest:
    """Reads the manifest of the committed checkpoint directory ``path``.

    Each process reads it on its own, without waiting on the others.

    Raises:
        FileNotFoundError: If ``path`` is not a jaxjob checkpoint directory.
        CorruptCheckpointError: If the manifest is not valid JSON or fails its
            checksum, or a file under ``path`` is a link leading outside it.
        ValueError: If the manifest is of another format or malformed.
    """
    file = fs.join(path, MANIFEST_ITEM, MANIFEST_FILE)
    leaving = fs.links_leaving(path)
    if leaving:
        raise checksum.corrupt(
            _epoch_of(path), path, f"links to files outside the checkpoint: {leaving}"
        )
    try:
        text = fs.read_text(file)
    except FileNotFoundError:
        if fs.exists(fs.join(path, MANIFEST_ITEM, "metadata")):
            raise ValueError(
                f"{path!r} has checkpoint format 2 or older; this jaxjob reads format {FORMAT} "
                "(write it again with this version of jaxjob)"
            ) from None
        raise FileNotFoundError(
            f"{path!r} is not a jaxjob checkpoint directory (no {MANIFEST_ITEM}/{MANIFEST_FILE})"
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise checksum.corrupt(
            _epoch_of(path), path, f"the manifest {file!r} is not valid JSON: {err}"
        ) from None
    if (
        isinstance(doc, dict)
        and doc.get("format") == FORMAT
        and checksum.SELF_KEY in doc
        and doc[checksum.SELF_KEY] != checksum.doc_checksum(doc)
    ):
        raise checksum.corrupt(_epoch_of(path), path, f"the manifest {file!r} fails its checksum")
    return Manifest.from_json(doc, path)


def _epoch_of(path: str) -> int | str:
    """The epoch in a checkpoint directory's name ``<node>.<epoch>``, or ``"?"``."""
    tail = path.rstrip("/").rpartition(".")[2]
    return int(tail) if tail.isdigit() else "?"
