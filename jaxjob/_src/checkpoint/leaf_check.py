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

from jaxjob._src.base.leaves import Kind
from jaxjob._src.checkpoint import checksum, hostlocal, manifest
from jaxjob._src.checkpoint.checksum import Record

__all__ = ["READ_ERRORS", "check_all", "check_leaf", "read_leaf"]


def _stored_target(spec: Any, found: Any) -> np.ndarray:
    """A NumPy target of the leaf as Orbax stores it (PRNG keys as key data, host-local rows)."""
    if spec.kind == Kind.PRNG_KEY:
        stored = jax.eval_shape(jax.random.key_data, spec.abstract())
    elif spec.host_local and found.owner_process is None:
        stored = hostlocal.target(spec, found.process_count, 0)
    else:
        stored = spec.abstract()
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
    bad, _ = checksum.mismatches(value, records.get(spec.name, []))
    return [checksum.describe(path, item, spec, found, r, "checksum mismatch") for r in bad]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


def check_all(reader: Any, path: str, found: Any, records: Mapping[str, list[Record]]) -> list[str]:
    """Reads every stored leaf of ``path`` with ``reader`` and checks it: a line per problem."""
    lines: list[str] = []
    for item in (manifest.STATE, manifest.OUTPUTS):
        for name in found.structure(item):
            for spec in found.specs(item, name):
                lines += check_leaf(reader, path, item, spec, found, records)
    return lines
