"""Reading stored leaves back, whole, on one process, and checking them against their checksums.

Used by every route that checks a checkpoint: :mod:`jaxjob._src.checkpoint.verify`
(a whole checkpoint), a manager's ``verify`` and the restore path of
:mod:`jaxjob._src.checkpoint.storage` (leaf by leaf, to name a damaged one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import memory
from jaxjob._src.base.leaves import Kind
from jaxjob._src.checkpoint import checksum, host_budget, hostlocal, manifest
from jaxjob._src.checkpoint.checksum import Record

__all__ = ["BATCH_BYTES", "READ_ERRORS", "check_all", "check_leaf", "read_leaf"]


def _stored(spec: Any, found: Any) -> Any:
    """The leaf's shape and dtype as Orbax stores it (PRNG keys as key data, host-local rows)."""
    if spec.kind == Kind.PRNG_KEY:
        return jax.eval_shape(jax.random.key_data, spec.abstract())
    if spec.host_local and found.owner_process is None:
        return hostlocal.target(spec, found.process_count, 0)
    return spec.abstract()


def _stored_target(spec: Any, found: Any) -> np.ndarray:
    """A NumPy target of the leaf as Orbax stores it."""
    stored = _stored(spec, found)
    return np.zeros(stored.shape, stored.dtype)


# Orbax wraps TensorStore's errors on bytes that do not decode (truncated, missing, garbled
# compressed chunks) in a plain Exception; callers re-read leaf by leaf to name the damaged ones.
READ_ERRORS = (Exception,)


def read_leaf(reader: Any, path: str, item: str, spec: Any, found: Any) -> np.ndarray:
    """Reads one stored leaf, whole, as Orbax stores it, through ``reader`` (a ``CheckpointIO``)."""
    tree = {spec.name: _stored_target(spec, found)}
    return reader.restore(path, item, tree)[spec.name]


def check_leaf(
    reader: Any, path: str, item: str, spec: Any, found: Any, records: Mapping[str, list[Record]]
) -> list[str]:
    """Reads one stored leaf and checks it: a line per problem, none when intact."""
    try:
        value = read_leaf(reader, path, item, spec, found)
    except READ_ERRORS as err:
        why = f"unreadable ({type(err).__name__}: {_first_line(err)})"
        return [checksum.describe(path, item, spec, found, None, why)]
    return _mismatches(path, item, spec, found, value, records)


def _mismatches(
    path: str, item: str, spec: Any, found: Any, value: Any, records: Mapping[str, list[Record]]
) -> list[str]:
    """A line per shard of the leaf read as ``value`` that disagrees with its checksum."""
    bad, _ = checksum.mismatches(value, records.get(spec.name, []))
    return [checksum.describe(path, item, spec, found, r, "checksum mismatch") for r in bad]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


#: At most this many bytes of leaves are read by one Orbax restore in :func:`check_all`
#: (a larger leaf is read alone): one restore per batch, not one per leaf, and the host
#: memory of a check stays bounded.
BATCH_BYTES = 256 * 2**20


def check_all(
    reader: Any,
    path: str,
    found: Any,
    records: Mapping[str, list[Record]],
    *,
    max_host_bytes: int | None = None,
) -> list[str]:
    """Reads every stored leaf of ``path`` with ``reader`` and checks it: a line per problem.

    The leaves are read in batches of at most :data:`BATCH_BYTES` (or of
    ``max_host_bytes``, a host-memory budget, if smaller), each by one
    Orbax restore: Orbax reads the item's metadata once per restore, so reading
    leaf by leaf costs time quadratic in the leaf count (a 3000-leaf checkpoint
    took minutes). A batch that does not read is read again leaf by leaf, to
    name the damaged leaves.
    """
    limit = BATCH_BYTES if max_host_bytes is None else min(BATCH_BYTES, max_host_bytes)
    if max_host_bytes is not None:
        memory.return_freed_buffers()
    lines: list[str] = []
    for item in (manifest.STATE, manifest.OUTPUTS):
        specs = [s for name in found.structure(item) for s in found.specs(item, name)]
        for batch in _batches(specs, found, limit):
            lines += _check_batch(reader, path, item, batch, found, records)
    return lines


def _batches(specs: list[Any], found: Any, limit: int = BATCH_BYTES) -> list[list[Any]]:
    """``specs`` in order, in runs of at most ``limit`` bytes (a larger one alone)."""
    batches: list[list[Any]] = []
    size = 0
    for spec in specs:
        nbytes = host_budget.host_bytes(_stored(spec, found))
        if not batches or size + nbytes > limit:
            batches.append([])
            size = 0
        batches[-1].append(spec)
        size += nbytes
    return batches


def _check_batch(
    reader: Any,
    path: str,
    item: str,
    batch: list[Any],
    found: Any,
    records: Mapping[str, list[Record]],
) -> list[str]:
    """Reads ``batch``'s leaves in one restore and checks each (leaf by leaf if it fails)."""
    if len(batch) == 1:
        return check_leaf(reader, path, item, batch[0], found, records)
    tree = {spec.name: _stored_target(spec, found) for spec in batch}
    try:
        values = reader.restore(path, item, tree)
    except READ_ERRORS:  # a damaged leaf among them: name it
        return [line for s in batch for line in check_leaf(reader, path, item, s, found, records)]
    return [
        line for s in batch for line in _mismatches(path, item, s, found, values[s.name], records)
    ]
