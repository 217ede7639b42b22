"""Readers of the files Orbax writes and has no public reader for: step metadata, saved shardings.

Orbax keeps a checkpoint's start and commit times in its step metadata file,
and how each ``jax.Array`` leaf was sharded in the ``state`` item's
``_sharding`` file; neither has a public reader that works without
constructing a checkpointer. Where the step metadata file lies is Orbax's
private ``step_metadata_file_path``
(:func:`jaxjob._src.internals.orbax_commit.step_metadata_file`).

Private Orbax names relied on: ``StepMetadata``'s fields
``init_timestamp_nsecs`` and ``commit_timestamp_nsecs`` (read from that
file), the ``_sharding`` file (``metadata.sharding._SHARDING``) and its
``sharding_type`` values ``NamedSharding`` and ``SingleDeviceSharding``
(``ShardingTypes``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxjob._src.base import fs
from jaxjob._src.internals import orbax_commit

__all__ = ["commit_times", "saved_named_shardings", "saved_shardings"]


def commit_times(path: str) -> tuple[float | None, float | None]:
    """When Orbax started and committed the checkpoint at ``path`` (seconds), if recorded.

    Orbax keeps them in its step metadata file, which has no public reader
    that works without constructing a checkpointer.
    """
    file = orbax_commit.step_metadata_file(path)
    try:
        doc = json.loads(fs.read_text(file))
    except (OSError, ValueError):
        return None, None
    start, commit = doc.get("init_timestamp_nsecs"), doc.get("commit_timestamp_nsecs")
    return (start / 1e9 if start else None), (commit / 1e9 if commit else None)


def _sharding_docs(path: str) -> dict[str, dict[str, Any]]:
    """Orbax's record of each ``jax.Array`` leaf's sharding at ``path``, by stored name."""
    try:
        doc = json.loads(fs.read_text(fs.join(path, "state", "_sharding")))
    except (OSError, ValueError):
        return {}
    found = {}
    for key, text in doc.items():
        try:
            found[base64.b64decode(key).decode()] = json.loads(text)
        except (ValueError, TypeError):  # not a leaf this version of jaxjob wrote
            continue
    return found


def saved_named_shardings(path: str) -> dict[str, jax.sharding.NamedSharding]:
    """The named sharding of each stored ``jax.Array`` at ``path``, on this job's devices.

    Rebuilt by Orbax's own ``NamedShardingMetadata`` from its ``_sharding``
    file: the saved mesh (device ids, axis names and types) and partition
    spec. Arrays on one device, whose devices this job lacks, or that Orbax
    does not record, are left out.
    """
    found = {}
    for name, doc in _sharding_docs(path).items():
        if not isinstance(doc, dict) or doc.get("sharding_type") != "NamedSharding":
            continue
        try:
            found[name] = ocp.metadata.NamedShardingMetadata.from_deserialized_dict(
                doc
            ).to_jax_sharding()
        except (ValueError, KeyError, TypeError):  # its devices are not this job's
            continue
    return found


def saved_shardings(path: str) -> dict[str, str]:
    """How each ``jax.Array`` leaf at ``path`` was sharded when saved, by stored name.

    Orbax records it in the ``state`` item's ``_sharding`` file (JSON, keyed
    by the base64 of the leaf's tree key), which has no public reader. Leaves
    it does not record are left out: private checkpoints, NumPy leaves.
    """
    found = {}
    for name, doc in _sharding_docs(path).items():
        try:
            found[name] = _describe_sharding(doc)
        except (ValueError, TypeError, KeyError):  # not a leaf this version of jaxjob wrote
            continue
    return found


def _describe_sharding(doc: dict[str, Any]) -> str:
    """``cpu:0`` for one device; ``P(None, 'model') on data=2,model=2`` for a named sharding."""
    if doc["sharding_type"] == "SingleDeviceSharding":
        return str(doc["device_str"])
    if doc["sharding_type"] == "NamedSharding":
        axes = ",".join(f"{a}={n}" for a, n in zip(doc["axis_names"], doc["shape"], strict=True))
        spec = ", ".join(
            repr(p) if not isinstance(p, list) else repr(tuple(p)) for p in doc["partition_spec"]
        )
        return f"P({spec}) on {axes}"
    return str(doc["sharding_type"])
