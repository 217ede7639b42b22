"""The manifest document's schema: every field's type and range, checked when it is read.

A manifest that passes its own checksum was written by a save, or edited
(or written by another tool) and its checksum fixed to match. These checks
refuse anything a save does not write, before any value becomes a shape, an
index, a dtype, a file name or a process number: a missing, null or unknown
field, a value of the wrong type (a float epoch, a string shape), one out of
range (a negative or huge shape, an owner process past the process count, a
NaN metric), a dtype outside :mod:`~jaxjob._src.checkpoint.dtypes`, tree
structures that are not trees of stored names, and leaves that the
structures do not reference exactly once each. Each check raises a
``ValueError`` naming the field (``epoch``, ``state['params'][0]``,
``leaves[3]``) and what it holds.
"""

from __future__ import annotations

import collections
import json
import math
import re
from typing import Any

from jaxjob._src.base.checks import is_int, is_number
from jaxjob._src.base.leaves import HOST_LOCAL, Kind
from jaxjob._src.checkpoint import checksum, dtypes, stored_names
from jaxjob._src.checkpoint.layout import check_node_name

__all__ = [
    "FIELDS",
    "LEAF_KEYS",
    "LINEAGE",
    "RUN_ID",
    "check",
    "check_leaf",
    "is_stored_name",
    "leaf_names",
]

RUN_ID = re.compile(r"[0-9a-f]{32}")  # a run's id: a uuid4's hex
FIELDS = frozenset(
    {"format", checksum.SELF_KEY, "epoch", "node", "process_count", "owner_process", "time"}
    | {"run", "state", "outputs", "leaves", "metrics", "checksums", "devices", "tier"}
    | {"life", "resumed_from"}
)
LINEAGE = frozenset({"life", "resumed_from"})  # since format 8
TIERS = ("persistent", "local")
DEVICE_KEYS = frozenset({"platform", "count", "memory_kinds"})
MAX_DEVICES = 1 << 24
_DEVICE_WORD = re.compile(r"[A-Za-z0-9_]{1,64}")  # "cpu", "gpu", "tpu"; "device", "pinned_host"
LEAF_KEYS = frozenset({"name", "path", "kind", "dtype", "shape", "impl", "nbytes", "device"})
MAX_EPOCH = (1 << 63) - 1  # an int64
MAX_PROCESSES = 1 << 20
MAX_DIMS = 64  # NumPy's
MAX_BYTES = 1 << 60  # a leaf's declared bytes, far past any array: no size overflows an int64
MAX_DEPTH = 256  # nested containers in one tree structure
_NODE_HELP = (
    '{"leaf": stored name}, {"none": true} or {"dict" | "list" | "tuple": [...]} (a "dict" '
    'may carry "variable": the name of its nnx.Variable type)'
)


def _show(value: Any) -> str:
    """A value of the document in an error: its JSON, cut short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 100 else text[:97] + "..."


def _require(ok: bool, field: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"{field[:200]} is {_show(value)}, expected {expected}")


def _keys(doc: Any, keys: frozenset[str], what: str) -> None:
    """Refuses a non-object, a missing key or an unknown key."""
    _require(isinstance(doc, dict), what, doc, "an object")
    missing, unknown = sorted(keys - set(doc)), sorted(set(doc) - keys)
    problems = [f"lacks {missing}"] * bool(missing) + [f"has unknown {unknown}"] * bool(unknown)
    if problems:
        raise ValueError(f"{what} {' and '.join(problems)}")


# ---- leaves ---------------------------------------------------------------------------------


def check_leaf(entry: Any) -> None:
    """Refuses a leaf entry a save does not write.

    Raises:
        ValueError: ``"invalid leaf entry 'l3' at ['w']: ..."``, saying what is
            wrong: a missing or unknown key, a name that is not a stored name,
            a dtype outside the allow-list, a shape that is not a list of ints
            >= 0, too large or wrong for the kind, or ``nbytes`` disagreeing
            with dtype and shape.
    """
    try:
        _check_leaf(entry)
    except ValueError as err:
        raise ValueError(f"invalid leaf entry {_label(entry)}: {err}") from None


def _label(entry: Any) -> str:
    """A leaf entry in an error: its stored name and key path, or its start."""
    if isinstance(entry, dict) and isinstance(entry.get("name"), str):
        return f"{entry['name'][:40]!r} at {str(entry.get('path'))[:200]}"
    return _show(entry)


_KINDS = tuple(Kind)  # made once: a manifest checks thousands of entries


def _check_leaf(entry: Any) -> None:
    _keys(entry, LEAF_KEYS, "the entry")
    name, path, kind, shape = entry["name"], entry["path"], entry["kind"], entry["shape"]
    stored_names.check(name)  # an Orbax key and, without OCDBT, directories
    _require(isinstance(path, str), "path", path, "a key path string")
    _require(kind in _KINDS, "kind", kind, f"one of {[str(k) for k in Kind]}")
    kind = Kind(kind)
    dtypes.check(kind, entry["dtype"], entry["impl"])
    dims = isinstance(shape, list) and len(shape) <= MAX_DIMS
    dims = dims and all(is_int(d) and d >= 0 for d in shape)
    _require(dims, "shape", shape, f"a list of at most {MAX_DIMS} ints >= 0")
    _check_size(kind, entry["dtype"], tuple(shape), entry["nbytes"])
    device, arrays = entry["device"], (Kind.JAX, Kind.PRNG_KEY)
    index = is_int(device) and 0 <= device < MAX_DEVICES and kind in arrays
    expected = f"null, or for a {' or '.join(map(str, arrays))} leaf an int in [0, {MAX_DEVICES})"
    _require(device is None or index, "device", device, expected)


def _check_size(kind: Kind, dtype: str, shape: tuple[int, ...], nbytes: Any) -> None:
    """Refuses a shape too large, empty where Orbax stores none, or ``nbytes`` not matching it."""
    count = math.prod(shape)
    _require(count * 16 <= MAX_BYTES, "shape", shape, f"at most {MAX_BYTES} bytes")
    if kind not in HOST_LOCAL:
        _require(count > 0, "shape", shape, "a non-empty shape (Orbax stores no zero-size array)")
        stored = kind == Kind.PRNG_KEY or dtypes.orbax_stores(dtype)
        _require(stored, "dtype", dtype, "a dtype that Orbax (TensorStore) stores")
        _require(nbytes is None, "nbytes", nbytes, f"null for a {kind} leaf")
        return
    _require(kind == Kind.NUMPY or not shape, "shape", shape, f"[] for a {kind} leaf")
    size = dtypes.nbytes(dtype, shape)
    _require(size <= MAX_BYTES, "shape", shape, f"at most {MAX_BYTES} bytes")
    expected = f"{size}, the bytes of {dtype} of shape {shape}"
    _require(is_int(nbytes) and nbytes == size, "nbytes", nbytes, expected)


# ---- tree structures ------------------------------------------------------------------------


def is_stored_name(value: Any) -> bool:
    """Whether ``value`` is a stored name that a save writes (see ``stored_names``)."""
    try:
        stored_names.check(value)
    except ValueError:
        return False
    return True


def leaf_names(structure: Any, where: str, depth: int = 0) -> list[str]:
    """The stored names that a manifest tree structure references, in order.

    Raises:
        ValueError: Naming (by ``where`` and the key path under it) the first
            node that is not a tree node, a dict key that is neither a string
            nor an int or bool key, a key twice in one dict, or nesting deeper
            than :data:`MAX_DEPTH`.
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"{where[:120]}... is nested deeper than {MAX_DEPTH} containers")
    structure = _without_variable(structure)
    tag = next(iter(structure)) if isinstance(structure, dict) and len(structure) == 1 else None
    value = structure[tag] if tag is not None else None
    if tag == "leaf" and is_stored_name(value):
        return [value]
    if tag == "none" and value is True:
        return []
    if tag in ("list", "tuple") and isinstance(value, list):
        return [
            name
            for i, child in enumerate(value)
            for name in leaf_names(child, f"{where}[{i}]", depth + 1)
        ]
    if tag == "dict" and isinstance(value, list):
        return _dict_leaf_names(value, where, depth)
    raise ValueError(f"{where} is {_show(structure)}, expected a tree node: {_NODE_HELP}")


def _without_variable(structure: Any) -> Any:
    """A dict node without the type name of the ``nnx.Variable`` it was (``"variable"``)."""
    typed = isinstance(structure, dict) and set(structure) == {"dict", "variable"}
    if typed and isinstance(structure["variable"], str) and len(structure["variable"]) <= 200:
        return {"dict": structure["dict"]}
    return structure


def _dict_leaf_names(pairs: list[Any], where: str, depth: int) -> list[str]:
    names: list[str] = []
    seen: set[Any] = set()
    for pair in pairs:
        ok = isinstance(pair, list) and len(pair) == 2
        _require(ok, f"an entry of {where}", pair, "a [key, tree node] pair")
        key = _dict_key(pair[0], where)
        _require(key not in seen, f"a key of {where}", pair[0], "each key once")
        seen.add(key)
        names += leaf_names(pair[1], f"{where}[{key!r}]", depth + 1)
    return names


def _dict_key(key: Any, where: str) -> Any:
    """A dict key of a structure: a string, ``{"int": n}`` or ``{"bool": b}``."""
    if isinstance(key, str):
        return key
    if isinstance(key, dict) and len(key) == 1:
        if is_int(key.get("int")):
            return key["int"]
        if isinstance(key.get("bool"), bool):
            return key["bool"]
    raise ValueError(
        f'a key of {where} is {_show(key)}, expected a string, {{"int": n}} or {{"bool": b}}'
    )


def _structures(value: Any, item: str) -> list[str]:
    _require(isinstance(value, dict), item, value, "an object: name -> tree structure")
    return [n for name, s in value.items() for n in leaf_names(s, f"{item}[{name!r}]")]


def _coverage(referenced: list[str], described: list[str]) -> None:
    """Refuses leaves described or referenced twice, or not both described and referenced."""
    for what, names in (
        ("leaves describes", described),
        ("state and outputs reference", referenced),
    ):
        twice = sorted(n for n, c in collections.Counter(names).items() if c > 1)
        if twice:
            raise ValueError(f"{what} {twice[:5]} more than once")
    missing = sorted(set(referenced) - set(described))
    if missing:
        raise ValueError(f"state and outputs reference {missing[:5]}, which leaves lacks")
    unused = sorted(set(described) - set(referenced))
    if unused:
        raise ValueError(f"leaves describes {unused[:5]}, which neither state nor outputs holds")


# ---- the document ---------------------------------------------------------------------------


def _finite(value: Any) -> bool:
    """Whether ``value`` is an int or float (not a bool) that a float holds, not NaN or inf."""
    try:
        return is_number(value) and math.isfinite(value)
    except OverflowError:  # an int past any float
        return False


def _is_node_name(node: str) -> bool:
    try:
        check_node_name(node)
    except ValueError:
        return False
    return True


def _check_run_fields(doc: dict[str, Any]) -> None:
    """Checks epoch, node, process count, owner, time and run."""
    epoch, count, owner = doc["epoch"], doc["process_count"], doc["owner_process"]
    _require(is_int(epoch) and 0 <= epoch <= MAX_EPOCH, "epoch", epoch, "an int >= 0")
    plain = isinstance(doc["node"], str) and _is_node_name(doc["node"])
    _require(plain, "node", doc["node"], "a plain directory name (no '/', '\\' or NUL)")
    counts = f"an int in [1, {MAX_PROCESSES}]"
    _require(is_int(count) and 1 <= count <= MAX_PROCESSES, "process_count", count, counts)
    owners = f"null or an int in [0, {count})"
    _require(
        owner is None or (is_int(owner) and 0 <= owner < count), "owner_process", owner, owners
    )
    _require(_finite(doc["time"]), "time", doc["time"], "a finite number of seconds")
    run = doc["run"]
    _require(isinstance(run, str) and bool(RUN_ID.fullmatch(run)), "run", run, "32 hex digits")


def _check_lineage(doc: dict[str, Any]) -> None:
    """Checks life (a run id's form) and resumed_from (null or an epoch)."""
    life, resumed = doc["life"], doc["resumed_from"]
    _require(isinstance(life, str) and bool(RUN_ID.fullmatch(life)), "life", life, "32 hex digits")
    epoch = is_int(resumed) and 0 <= resumed <= MAX_EPOCH
    _require(resumed is None or epoch, "resumed_from", resumed, "null or an int >= 0")


def _check_metrics(metrics: Any) -> None:
    _require(isinstance(metrics, dict), "metrics", metrics, "an object: name -> number")
    for name, value in metrics.items():
        _require(_finite(value), f"metrics[{name!r}]", value, "a finite number")


def _check_devices(value: Any) -> None:
    """Refuses a devices record other than a platform, a device count and memory kinds."""
    expected = (
        f'{{"platform": a name, "count": an int in [1, {MAX_DEVICES}], "memory_kinds": a '
        "sorted list of distinct names}"
    )
    ok = isinstance(value, dict) and set(value) == DEVICE_KEYS
    ok = (
        ok
        and isinstance(value["platform"], str)
        and bool(_DEVICE_WORD.fullmatch(value["platform"]))
    )
    ok = ok and is_int(value["count"]) and 1 <= value["count"] <= MAX_DEVICES
    kinds = value.get("memory_kinds") if isinstance(value, dict) else None
    ok = ok and isinstance(kinds, list) and len(kinds) <= 16
    ok = ok and all(isinstance(k, str) and bool(_DEVICE_WORD.fullmatch(k)) for k in kinds)
    ok = ok and kinds == sorted(set(kinds))
    _require(ok, "devices", value, expected)


def _check_checksums(value: Any, count: int, owner: int | None) -> None:
    """Refuses checksums other than the algorithm and every saving process's file."""
    writers = range(count) if owner is None else [owner]
    files = value.get("files") if isinstance(value, dict) else None
    ok = isinstance(value, dict) and set(value) == {"algorithm", "files"}
    ok = ok and value["algorithm"] == checksum.ALGORITHM and isinstance(files, list)
    ok = ok and len(files) == len(writers)
    ok = ok and all(f == checksum.checksums_file(p) for f, p in zip(files, writers, strict=True))
    expected = (
        f'{{"algorithm": "{checksum.ALGORITHM}", "files": [...]}} naming the checksum file '
        f"of each of the {len(writers)} saving process(es)"
    )
    _require(ok, "checksums", value, expected)


def check(doc: Any, *, lineage: bool = True) -> None:
    """Refuses a manifest document holding anything a save does not write.

    Its format and its own checksum are the reader's to check; this checks
    every field.

    Args:
        doc: The manifest document.
        lineage: Whether it has the fields of :data:`LINEAGE` (format 8 and
            later); a format-7 document must not.

    Raises:
        ValueError: Naming the first field that is wrong, and what it holds.
    """
    _keys(doc, FIELDS if lineage else FIELDS - LINEAGE, "the manifest")
    _check_run_fields(doc)
    if lineage:
        _check_lineage(doc)
    referenced = _structures(doc["state"], "state") + _structures(doc["outputs"], "outputs")
    _require(isinstance(doc["leaves"], list), "leaves", doc["leaves"], "a list of leaf entries")
    for i, entry in enumerate(doc["leaves"]):
        try:
            check_leaf(entry)
        except ValueError as err:
            raise ValueError(f"leaves[{i}]: {err}") from None
    _coverage(referenced, [entry["name"] for entry in doc["leaves"]])
    stored_names.check_disjoint(referenced)
    _check_metrics(doc["metrics"])
    _check_checksums(doc["checksums"], doc["process_count"], doc["owner_process"])
    _check_devices(doc["devices"])
    _require(doc["tier"] in TIERS, "tier", doc["tier"], " or ".join(map(repr, TIERS)))
