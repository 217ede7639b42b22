"""Which dtypes a checkpoint holds: the allow-list each leaf's dtype name is checked against.

A save refuses a leaf of any other dtype before writing anything; a read
refuses a manifest naming one (it was edited or written by another tool), so
no crafted dtype name reaches NumPy's parser or reinterprets stored bytes.

* ``jax.Array`` leaves: a name of :data:`NUMERIC`.
* Host-local leaves (NumPy arrays and scalars, stored as bytes): a name of
  :data:`NUMERIC`, or NumPy's own bool, integer, float, complex, bytes, str,
  void, datetime and timedelta dtypes by their canonical names (``">f4"``,
  ``"<U3"``, ``"datetime64[ns]"``, ``"float128"``); never object, structured
  or sub-array dtypes.
* Python scalars: ``"bool"``, ``"int"`` or ``"float"``.
* PRNG keys: an implementation of :data:`PRNG_IMPLS` and the dtype of its
  keys (``"key<fry>"`` for ``threefry2x32``).

A host-local leaf is stored as the bytes of :func:`dtype_of` its dtype name
(Python's ``int`` as ``int64``), :func:`nbytes` of them per copy.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16, int4, float8_* ... with NumPy)
import numpy as np
import tensorstore as ts

from jaxjob._src.base.leaves import Kind

__all__ = [
    "NUMERIC",
    "PRNG_IMPLS",
    "PYTHON",
    "check",
    "dtype_of",
    "key_dtype",
    "nbytes",
    "orbax_stores",
]

_NAMES = [
    *("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    *("float16", "float32", "float64", "complex64", "complex128"),
    *("bfloat16", "int2", "int4", "uint2", "uint4", "float4_e2m1fn", "float8_e3m4"),
    *("float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"),
    *("float8_e5m2fnuz", "float8_e8m0fnu"),
]  # NumPy's and ml_dtypes' numeric dtypes


def _known(names: list[str]) -> frozenset[str]:
    """The names NumPy (with ml_dtypes) knows here, as they name themselves."""
    known = set()
    for name in names:
        try:
            known.add(str(np.dtype(name)))
        except TypeError:  # an older ml_dtypes without it
            continue
    return frozenset(known)


NUMERIC = _known(_NAMES)  # the dtypes of jax.Array leaves
PYTHON = frozenset({"bool", "int", "float"})  # Python scalars' type names
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
_NUMPY_KINDS = "biufcSUVmM"  # NumPy's dtype kinds a host-local leaf may have (not "O")
_MAX_NAME = 64  # characters: NumPy's canonical names are far shorter


@functools.cache
def orbax_stores(dtype: np.dtype) -> bool:
    """Whether Orbax can write arrays of ``dtype``: TensorStore, which writes them, has it."""
    try:
        ts.dtype(np.dtype(dtype).name)
    except (TypeError, ValueError):
        return False
    return True


@functools.cache
def key_dtype(impl: str) -> str:
    """The dtype name of the PRNG keys of implementation ``impl`` (``"key<fry>"``)."""
    return str(jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype)


def _numpy_native(name: str) -> bool:
    """Whether ``name`` is the canonical name of a plain NumPy dtype a host-local leaf may have."""
    if len(name) > _MAX_NAME:
        return False
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError, OverflowError, SyntaxError):
        return False
    plain = dtype.fields is None and dtype.subdtype is None and dtype.itemsize > 0
    return plain and dtype.kind in _NUMPY_KINDS and str(dtype) == name


def _allowed(kind: Kind) -> str:
    """What a leaf of ``kind`` may have, for an error."""
    if kind == Kind.PRNG_KEY:
        return f"keys of {list(PRNG_IMPLS)}"
    if kind == Kind.PYTHON:
        return str(sorted(PYTHON))
    numeric = ", ".join(sorted(NUMERIC))
    if kind == Kind.JAX:
        return numeric
    return f"{numeric}, or a plain NumPy dtype by its canonical name ('>f4', '<U3', ...)"


def _problem(kind: Kind, dtype: Any, impl: Any) -> str | None:
    if not isinstance(dtype, str):
        return f"dtype {dtype!r} is not a dtype name"
    if kind == Kind.PRNG_KEY:
        if impl not in PRNG_IMPLS:
            return f"PRNG implementation {impl!r} is not one of {list(PRNG_IMPLS)}"
        if dtype != key_dtype(impl):
            return f"dtype {dtype!r} is not that of {impl} keys ({key_dtype(impl)!r})"
        return None
    if impl is not None:
        return f"impl {impl!r} is given for a leaf that is not a PRNG key"
    if kind == Kind.PYTHON:
        ok = dtype in PYTHON
    elif kind == Kind.JAX:
        ok = dtype in NUMERIC
    else:
        ok = dtype in NUMERIC or _numpy_native(dtype)
    return None if ok else f"dtype {dtype[:_MAX_NAME]!r} is not one a {kind} leaf can have"


def check(kind: Kind, dtype: Any, impl: Any = None) -> None:
    """Refuses a dtype name (and PRNG implementation) that a leaf of ``kind`` cannot have.

    Raises:
        ValueError: Naming the dtype (or implementation) and what is allowed.

    Example:
        >>> check(Kind.NUMPY, "<U3"), check(Kind.PRNG_KEY, "key<fry>", "threefry2x32")
        (None, None)
        >>> check(Kind.PYTHON, "str")
        Traceback (most recent call last):
        ...
        ValueError: dtype 'str' is not one a python leaf can have (allowed: ['bool', 'float', ...])
    """
    problem = _problem(kind, dtype, impl)
    if problem is not None:
        raise ValueError(f"{problem} (allowed: {_allowed(kind)})")


def dtype_of(dtype: str) -> np.dtype:
    """The NumPy dtype a host-local leaf of dtype name ``dtype`` is stored as.

    Example:
        >>> dtype_of("int"), dtype_of("float16")
        (dtype('int64'), dtype('float16'))
    """
    return np.dtype({"bool": np.bool_, "int": np.int64, "float": np.float64}.get(dtype, dtype))


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """The bytes of one copy of a host-local leaf of dtype name ``dtype`` and ``shape``.

    Example:
        >>> nbytes("float32", (2, 3)), nbytes("int", ())
        (24, 8)
    """
    return math.prod(shape) * dtype_of(dtype).itemsize
