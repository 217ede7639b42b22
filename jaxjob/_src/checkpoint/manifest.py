"""The manifest of one checkpoint directory: what it holds and how to rebuild it.

The manifest is a JSON file, ``<checkpoint>/jaxjob/manifest.json``, written
with the checkpoint's arrays and committed with them. It holds the format
version, the epoch and node, how many processes saved it, its lineage (the
run that saved it, :mod:`~jaxjob._src.checkpoint.run_identity`; the life of
the job that saved it and the epoch that life resumed from), the tree structure of each
persistent name (``state``) and of each saved stop-condition output
(``outputs``), one :class:`~jaxjob._src.checkpoint.leaf_spec.LeafSpec` per stored
leaf, the checksum files, and its own checksum. It is read once per load and
passed down; nothing in it is executed.

Reading refuses, as corrupt, a manifest without its own checksum or failing
it, one with any field missing, null, mistyped or out of range
(:mod:`~jaxjob._src.checkpoint.schema`), and one naming another node or epoch
than its directory ``<node>.<epoch>`` (a copied or swapped directory).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import jax

from jaxjob._src.base import crc32c, fs
from jaxjob._src.base.checks import is_int
from jaxjob._src.checkpoint import checksum, keypaths, schema, stored_names
from jaxjob._src.checkpoint.layout import get_ckpt_filename, parse_name
from jaxjob._src.checkpoint.leaf_spec import LeafSpec
from jaxjob._src.checkpoint.tree import flatten

__all__ = [
    "FORMAT",
    "MANIFEST_FILE",
    "MANIFEST_ITEM",
    "Layout",
    "Manifest",
    "assemble",
    "build",
    "describe",
    "devices_record",
    "read",
    "same_devices",
]

FORMAT = 8  # 5: devices record; 6: tier; 7: names are escaped key paths, Variables typed; 8: life
READABLE = (7, FORMAT)  # a format-7 manifest reads with life and resumed_from None
MANIFEST_ITEM = "jaxjob"
MANIFEST_FILE = "manifest.json"
STATE = "state"
OUTPUTS = "outputs"
_LEAVES = "leaves 5d0c8e3a9f2b4c17"  # where a manifest's canonical text has its leaves


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What one checkpoint directory holds.

    Attributes:
        epoch: The epoch saved.
        node: The node saved.
        process_count: How many processes saved it.
        owner_process: The process that saved it alone, or None (every process).
        time: When the save started (seconds since the epoch).
        run: The id of the run that saved it: its db_prefix's
            (:mod:`~jaxjob._src.checkpoint.run_identity`).
        state: Persistent name -> JSON tree structure.
        outputs: Saved stop-condition output name -> JSON tree structure.
        leaves: Stored name -> :class:`~jaxjob._src.checkpoint.leaf_spec.LeafSpec`.
        checksums: The checksum algorithm and the files holding each
            process's checksums (:mod:`jaxjob._src.checkpoint.checksum`).
        metrics: Scalars that retention ranks by (:class:`jaxjob.keep.Best`),
            name -> value; read without reading any array.
        devices: The devices of the job that saved it: ``{"platform": "cpu",
            "count": 8, "memory_kinds": ["device"]}`` (the memory kinds of its
            ``jax.Array`` leaves). A resume on the same devices restores the
            arrays with the shardings they were saved with
            (:func:`same_devices`).
        tier: ``"persistent"`` (saved under a db_prefix) or ``"local"``
            (one process's local-tier copy: with ``owner_process`` set in a
            multi-process job, its ``jax.Array`` leaves hold only that
            process's shards, restorable on the same shardings only).
        life: The id of the life (attempt) that saved it: one
            ``JobRunner.train`` call, the same id on every process (a
            manager used without a runner: one id per manager). None in a
            format-7 manifest.
        resumed_from: The epoch that life resumed from; None when it started
            from scratch, was not started by a runner, or in a format-7 manifest.
    """

    epoch: int
    node: str
    process_count: int
    owner_process: int | None
    time: float
    run: str
    state: dict[str, Any]
    outputs: dict[str, Any]
    leaves: dict[str, LeafSpec]
    checksums: dict[str, Any]
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    devices: dict[str, Any] = dataclasses.field(default_factory=dict)
    tier: str = "persistent"
    life: str | None = None
    resumed_from: int | None = None

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

    def specs(self, item: str, name: str) -> list[LeafSpec]:
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
        doc[checksum.SELF_KEY] = _doc_checksum(doc, self.leaves.values())
        return doc

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Manifest:
        """Reads the JSON document of the checkpoint at ``where``, refusing a malformed one.

        Raises:
            ValueError: If it is of another format (naming both).
            CorruptCheckpointError: Naming the manifest file, if it lacks its
                own checksum or fails it, or a field is missing, null, of the
                wrong type or out of range (naming the field;
                :mod:`~jaxjob._src.checkpoint.schema`): it was damaged, edited
                or written by another tool.
        """
        file = fs.join(where, MANIFEST_ITEM, MANIFEST_FILE)
        _check_format(doc, where, file)
        _check_self(doc, where, file)
        lineage = doc["format"] >= 8
        try:
            schema.check(doc, lineage=lineage)
            for name in [*doc[STATE], *doc[OUTPUTS]]:
                check_name(name)
        except ValueError as err:
            raise checksum.corrupt(
                _epoch_of(where, doc),
                where,
                f"the manifest {file!r} is malformed: {err}; it passes its own checksum, so it "
                "was edited or written by another tool (restore another epoch, or save this "
                "one again)",
            ) from None
        return cls(
            epoch=doc["epoch"],
            node=doc["node"],
            process_count=doc["process_count"],
            owner_process=doc["owner_process"],
            time=float(doc["time"]),
            run=doc["run"],
            state=doc[STATE],
            outputs=doc[OUTPUTS],
            # schema.check above checked every entry: each is read, not checked again
            leaves={e["name"]: LeafSpec.from_json(e, checked=True) for e in doc["leaves"]},
            checksums=doc["checksums"],
            metrics={name: float(value) for name, value in doc["metrics"].items()},
            devices=doc["devices"],
            tier=doc["tier"],
            life=doc["life"] if lineage else None,
            resumed_from=doc["resumed_from"] if lineage else None,
        )


def _doc_checksum(doc: dict[str, Any], specs: Iterable[LeafSpec]) -> int:
    """``checksum.doc_checksum(doc)``, with each leaf's canonical JSON made once per spec."""
    text = json.dumps({**doc, "leaves": _LEAVES}, sort_keys=True)
    head, mark, tail = text.partition(json.dumps(_LEAVES))
    if text.count(mark) != 1:  # the mark is in a name: the whole document's text, made afresh
        return checksum.doc_checksum(doc)
    leaves = ", ".join(spec.canonical_json for spec in specs)
    return crc32c.of_bytes(f"{head}[{leaves}]{tail}".encode())


def _check_format(doc: Any, where: str, file: str) -> None:
    """Refuses a document of another format (a ValueError) or with no format (corrupt)."""
    found = doc.get("format") if isinstance(doc, dict) else None
    if not is_int(found):
        shown = json.dumps(found)[:40]
        what = f"the manifest {file!r} has no format version (its format is {shown})"
        raise checksum.corrupt(_epoch_of(where, doc), where, what)
    if found not in READABLE:
        fix = (
            "write it again with this version of jaxjob"
            if found < FORMAT
            else "it was written by a newer jaxjob: upgrade jaxjob to read it"
        )
        raise ValueError(
            f"{where!r} has checkpoint format {str(found)[:20]}; this jaxjob reads format "
            f"{FORMAT} ({fix})"
        )


def _check_self(doc: dict[str, Any], where: str, file: str) -> None:
    """Refuses a document without its own checksum, or failing it."""
    if checksum.SELF_KEY not in doc:
        what = (
            f"the manifest {file!r} has no {checksum.SELF_KEY} (every format-{FORMAT} "
            "manifest carries one): it was edited or written by another tool"
        )
        raise checksum.corrupt(_epoch_of(where, doc), where, what)
    try:
        intact = doc[checksum.SELF_KEY] == checksum.doc_checksum(doc)
    except RecursionError:  # nested deeper than JSON's encoder goes: no save writes that
        intact = False
    if not intact:
        what = f"the manifest {file!r} fails its checksum"
        raise checksum.corrupt(_epoch_of(where, doc), where, what)


def check_name(name: str) -> None:
    """Refuses a workspace name that reads as an unsafe path (the names jaxjob uses pass)."""
    parts = name.split("/")
    if "\0" in name or name.startswith("/") or "." in parts or ".." in parts:
        raise ValueError(
            f"workspace name {name!r} cannot be checkpointed: a saved name must not start "
            "with '/', hold NUL or have '.' or '..' between its '/'s; rename it"
        )


class Layout(NamedTuple):
    """What the workspace's structure alone decides in a manifest (fields: see :class:`Manifest`).

    ``memory_kinds``: those of the ``jax.Array`` state leaves, sorted (``devices`` records them).
    """

    state: dict[str, Any]
    outputs: dict[str, Any]
    leaves: dict[str, LeafSpec]
    memory_kinds: list[str]


def build(
    epoch: int,
    node: str,
    state: Mapping[str, Any],
    outputs: Mapping[str, Any],
    owner_process: int | None,
    *,
    run: str,
    tier: str = "persistent",
    life: str | None = None,
    resumed_from: int | None = None,
) -> tuple[Manifest, dict[str, dict[str, Any]]]:
    """The manifest of a save, and each item's leaves by stored name.

    Args:
        epoch: The epoch saved.
        node: The node saved.
        state: The persistent workspace.
        outputs: The stop-condition outputs saved with it.
        owner_process: The process saving it alone, or None (every process).
        run: The run id of the db_prefix it is saved under
            (:func:`jaxjob._src.checkpoint.run_identity.ensure`).
        tier: ``"persistent"`` or ``"local"`` (see :class:`Manifest`).
        life: The id of the life saving it (see :class:`Manifest`); None: a
            new one (the save is a life of its own).
        resumed_from: The epoch that life resumed from (None: from scratch).

    Raises:
        TypeError: Naming the key path of a leaf that cannot be checkpointed.
        ValueError: If a workspace name is unsafe as a path (``..``, absolute, NUL).
    """
    layout, flat = describe(state, outputs)
    lineage = {"run": run, "tier": tier, "life": life, "resumed_from": resumed_from}
    return assemble(layout, epoch, node, owner_process, **lineage), flat


def describe(state: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple[Layout, dict]:
    """The layout of a save, and each item's leaves by stored name (raises as :func:`build`)."""
    namer = stored_names.Namer()
    structures: dict[str, dict[str, Any]] = {STATE: {}, OUTPUTS: {}}
    leaves: dict[str, LeafSpec] = {}
    flat: dict[str, dict[str, Any]] = {STATE: {}, OUTPUTS: {}}
    for item, tree in ((STATE, state), (OUTPUTS, outputs)):
        for name, value in tree.items():
            check_name(name)
            structure, found = flatten(value, f"[{name!r}]", namer, tuple(name.split("/")))
            structures[item][name] = structure
            for stored, leaf, path in found:
                leaves[stored] = LeafSpec.of(leaf, stored, path)
                flat[item][stored] = leaf
    kinds = {
        str(leaf.sharding.memory_kind)
        for leaf in flat[STATE].values()
        if isinstance(leaf, jax.Array) and leaf.sharding.memory_kind is not None
    }
    return Layout(structures[STATE], structures[OUTPUTS], leaves, sorted(kinds)), flat


def assemble(
    layout: Layout, epoch: int, node: str, owner_process: int | None, *, run: str, tier: str,
    life: str | None, resumed_from: int | None,
) -> Manifest:  # fmt: skip
    """The manifest of a save of ``layout`` (the other arguments: see :func:`build`)."""
    writers = range(jax.process_count()) if owner_process is None else [owner_process]
    return Manifest(
        epoch=epoch,
        node=node,
        process_count=jax.process_count(),
        owner_process=owner_process,
        time=time.time(),
        run=run,
        state=dict(layout.state),
        outputs=dict(layout.outputs),
        leaves=dict(layout.leaves),
        checksums={
            "algorithm": checksum.ALGORITHM,
            "files": [checksum.checksums_file(p) for p in writers],
        },
        devices=devices_record(list(layout.memory_kinds)),
        tier=tier,
        life=life or uuid.uuid4().hex,
        resumed_from=resumed_from,
    )


def devices_record(memory_kinds: list[str]) -> dict[str, Any]:
    """This job's devices, as a manifest records them."""
    return {
        "platform": jax.devices()[0].platform,
        "count": jax.device_count(),
        "memory_kinds": memory_kinds,
    }


def same_devices(found: Manifest) -> bool:
    """Whether this job runs on the devices that saved ``found``.

    The same platform, device and process counts, and the saved arrays in the
    devices' default memory.

    Example:
        >>> m = build(0, "n", {"w": jax.numpy.ones(2)}, {}, None, run="0" * 32)[0]
        >>> same_devices(m)
        True
    """
    try:
        default = jax.devices()[0].default_memory().kind
    except (AttributeError, RuntimeError, NotImplementedError):  # a backend without memories
        return False
    here = devices_record([])
    return (
        found.process_count == jax.process_count()
        and all(found.devices.get(k) == here[k] for k in ("platform", "count"))
        and set(found.devices.get("memory_kinds", ["?"])) <= {default}
    )


def read(path: str) -> Manifest:
    """Reads the manifest of the committed checkpoint directory ``path``.

    Each process reads it on its own, without waiting on the others. When
    the directory's name is ``<node>.<epoch>`` (not, say, a copy at
    ``/tmp/x``), it must be the manifest's own node and epoch. The run is
    not checked here: see :func:`jaxjob._src.checkpoint.run_identity.check`.

    Raises:
        FileNotFoundError: If ``path`` is not a jaxjob checkpoint directory.
        CorruptCheckpointError: If the manifest is not valid JSON, lacks or
            fails its own checksum, is malformed (see :meth:`Manifest.from_json`),
            or names another node or epoch than the directory's name (a copied
            or swapped directory), or a file under ``path`` is a link leading
            outside it.
        ValueError: If the manifest is of another format.
    """
    file = fs.join(path, MANIFEST_ITEM, MANIFEST_FILE)
    leaving = fs.links_leaving(path)
    if leaving:
        raise checksum.corrupt(
            _epoch_of(path), path, f"links to files outside the checkpoint: {leaving}"
        )
    try:
        text = fs.read_text(file)
    except UnicodeDecodeError as err:  # a flipped byte: not UTF-8
        raise checksum.corrupt(
            _epoch_of(path), path, f"the manifest {file!r} is not UTF-8 text: {err}"
        ) from None
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
    except (ValueError, RecursionError) as err:  # ValueError: also an int of 4300+ digits
        raise checksum.corrupt(
            _epoch_of(path), path, f"the manifest {file!r} is not valid JSON: {err}"
        ) from None
    found = Manifest.from_json(doc, path)
    _check_place(found, path)
    return found


def _check_place(found: Manifest, path: str) -> None:
    """Refuses a manifest of another node or epoch than its directory's name ``<node>.<epoch>``."""
    base = path.rstrip("/").rpartition("/")[2]
    entry = parse_name(base)
    if entry is None or (entry.node, entry.epoch) == (found.node, found.epoch):
        return
    raise checksum.corrupt(
        entry.epoch,
        path,
        f"the manifest says epoch {found.epoch} node {found.node!r} but the directory is "
        f"{base}: a copied or swapped checkpoint directory (rename it "
        f"{get_ckpt_filename(found.node, found.epoch)!r} if that is what it holds)",
    )


def _epoch_of(path: str, doc: Any = None) -> int | str:
    """The epoch of a directory's name ``<node>.<epoch>``, else the manifest's, else ``"?"``."""
    entry = parse_name(path.rstrip("/").rpartition("/")[2])
    if entry is not None:
        return entry.epoch
    epoch = doc.get("epoch") if isinstance(doc, dict) else None
    return epoch if is_int(epoch) and epoch >= 0 else "?"
