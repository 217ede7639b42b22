"""The workspace ``jaxjob bench`` measures: its leaves' shapes and dtypes, filled at random.

A synthetic workspace (``--leaves N --bytes SIZE``: N float32 vectors), or
the leaves of an existing checkpoint (``--like PATH``), read from its
manifests as ``jaxjob show`` reads them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Leaf",
    "leaves_like",
    "parse_size",
    "random_arrays",
    "synthetic_leaves",
    "workspace_leaves",
]

DEFAULT_LEAVES = 56
DEFAULT_BYTES = "64MiB"
SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]i?b|b)?", re.IGNORECASE)
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, argument: str = "--bytes") -> int:
    """A byte count from ``64MiB``, ``1GiB``, ``512KiB``, ``10MB`` or a plain number.

    Example:
        >>> parse_size("64MiB"), parse_size("1.5KiB"), parse_size("4096")
        (67108864, 1536, 4096)

    Raises:
        ValueError: Naming ``argument``, what was received and what was expected.
    """
    match = SIZE.fullmatch(text.strip())
    if match is None or float(match.group(1)) < 1:
        raise ValueError(
            f"{argument}: got {text!r}; expected a size of at least 1 byte, such as 64MiB, "
            "512KiB, 1GiB, 10MB or a plain byte count"
        )
    return int(float(match.group(1)) * UNITS[(match.group(2) or "").lower()])


@dataclasses.dataclass(frozen=True)
class Leaf:
    """The shape and dtype of one leaf of the measured workspace.

    Attributes:
        shape: Its shape.
        dtype: Its NumPy dtype.
        host_local: A NumPy array (each process's own copy), not a ``jax.Array``.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    host_local: bool = False

    @property
    def nbytes(self) -> int:
        """Its bytes."""
        return math.prod(self.shape) * self.dtype.itemsize


def synthetic_leaves(count: int, total_bytes: int) -> list[Leaf]:
    """``count`` float32 vectors holding ``total_bytes`` between them, as evenly as can be.

    Example:
        >>> [leaf.shape for leaf in synthetic_leaves(3, 40)]
        [(4,), (3,), (3,)]

    Raises:
        ValueError: If ``count`` < 1, or ``total_bytes`` gives a leaf less than one float32.
    """
    if count < 1:
        raise ValueError(f"--leaves: got {count}; expected at least 1 leaf")
    if total_bytes < 4 * count:
        raise ValueError(
            f"--bytes: got {total_bytes} bytes for {count} leaves; expected at least 4 bytes "
            "(one float32) a leaf"
        )
    base, extra = divmod(total_bytes // 4, count)
    return [Leaf((base + (i < extra),), np.dtype(np.float32)) for i in range(count)]


def leaves_like(path: str) -> list[Leaf]:
    """The leaves of the checkpoint at ``path`` (a db_prefix: its latest committed epoch).

    Read from the checkpoints' manifests, as ``jaxjob show`` does; PRNG keys
    become their key data.

    Raises:
        FileNotFoundError: If there is no committed checkpoint at ``path``.
    """
    from jaxjob._src.base.leaves import Kind
    from jaxjob._src.checkpoint import manifest
    from jaxjob._src.checkpoint.restore import checkpoint_dirs

    leaves = []
    for directory in checkpoint_dirs(path, None, None):
        for spec in manifest.read(directory).leaves.values():
            abstract = spec.abstract()
            if spec.kind == Kind.PRNG_KEY:
                abstract = jax.eval_shape(jax.random.key_data, abstract)
            leaves.append(Leaf(tuple(abstract.shape), np.dtype(abstract.dtype), spec.host_local))
    return leaves


def workspace_leaves(leaves: int | None, size: str | None, like: str | None) -> list[Leaf]:
    """The measured workspace: ``leaves`` float32 vectors of ``size`` bytes, or ``like``'s leaves.

    Raises:
        ValueError: If ``like`` comes with ``leaves`` or ``size``, or one is malformed.
        FileNotFoundError: If ``like`` is no committed checkpoint.
    """
    if like is None:
        total = parse_size(DEFAULT_BYTES if size is None else size)
        return synthetic_leaves(DEFAULT_LEAVES if leaves is None else leaves, total)
    if leaves is not None or size is not None:
        raise ValueError(
            f"--like: got {like!r} with --leaves or --bytes; expected either --like (the leaves "
            "of a checkpoint) or --leaves and --bytes (a synthetic workspace)"
        )
    return leaves_like(like)


def _random(leaf: Leaf, rng: np.random.Generator) -> Any:
    if leaf.dtype == np.bool_:
        value = rng.random(leaf.shape) < 0.5
    elif jnp.issubdtype(leaf.dtype, jnp.integer):
        value = rng.integers(0, 8, leaf.shape).astype(leaf.dtype)
    else:
        value = rng.standard_normal(leaf.shape, dtype=np.float32).astype(leaf.dtype)
    return value if leaf.host_local else jax.device_put(value)


def random_arrays(leaves: list[Leaf], seed: int = 0) -> list[Any]:
    """Random arrays of ``leaves``' shapes and dtypes: ``jax.Array``s but the host-local ones.

    Example:
        >>> [a.dtype.name for a in random_arrays([Leaf((2,), np.dtype("int8"), True)])]
        ['int8']
    """
    rng = np.random.default_rng(seed)
    return [_random(leaf, rng) for leaf in leaves]
