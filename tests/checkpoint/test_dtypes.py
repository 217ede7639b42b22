"""The dtype allow-list: every dtype a checkpoint stored before is still saved; others refused."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxjob
from jaxjob._src.base.leaves import Kind
from jaxjob._src.checkpoint import dtypes, leaf_spec

HOST_LOCAL = {
    "bool": np.array([True, False]),
    "int64": np.arange(3),
    "uint16": np.arange(3, dtype=np.uint16),
    "float16": np.ones(2, np.float16),
    "bfloat16": np.ones(2, ml_dtypes.bfloat16),
    "uint4": np.ones(2, ml_dtypes.uint4),
    "float8_e4m3": np.ones(2, ml_dtypes.float8_e4m3),
    "complex128": np.ones(2, np.complex128),
    "longdouble": np.ones(2, np.longdouble),
    "big-endian": np.arange(3, dtype=">f4"),
    "str": np.array(["ab", "c"]),
    "bytes": np.array([b"ab"]),
    "datetime": np.array(["2026-01-01"], "datetime64[ns]"),
    "timedelta": np.array([5], "timedelta64[s]"),
    "void": np.zeros(2, "V3"),
    "scalar": np.float32(2.5),
    "empty": np.zeros((0, 3), np.float32),
}


def test_every_plain_numpy_dtype_round_trips(tmp_path):
    """NumPy arrays of each plain dtype (strings, dates, big-endian, ml_dtypes) come back alike."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, HOST_LOCAL)
    ckpt.close()
    restored = jaxjob.restore(str(tmp_path))
    for name, value in HOST_LOCAL.items():
        assert restored[name].dtype == value.dtype, name
        assert restored[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.int4, jnp.float8_e5m2, jnp.bool_, jnp.int8])
def test_jax_arrays_of_numeric_dtypes_round_trip(tmp_path, dtype):
    """jax.Array leaves of the numeric dtypes TensorStore stores come back with their dtype."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"x": jnp.ones(4, dtype)})
    ckpt.close()
    assert jaxjob.restore(str(tmp_path))["x"].dtype == dtype


@pytest.mark.parametrize("dtype", ["i4,f8", [("a", "<i4")], [("a", "<f4", (2,))]])
def test_a_structured_numpy_array_is_refused_at_save(tmp_path, dtype):
    """A structured array (its dtype's name parses back to no dtype) is refused before writing."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    with pytest.raises(
        leaf_spec.UnstorableLeafError,
        match=r"cannot checkpoint the leaf at \['x'\] \(shape \(\d,?\d?\)\): dtype .* is not one "
        r"a numpy leaf can have",
    ):
        ckpt.save(0, {"x": np.zeros(2, dtype)})
    ckpt.close()
    assert not (tmp_path / "local.0").exists()


@pytest.mark.parametrize(
    "kind, dtype, impl",
    [
        (Kind.JAX, "float128", None),
        (Kind.JAX, "<U3", None),
        (Kind.JAX, "object", None),
        (Kind.NUMPY, "O", None),
        (Kind.NUMPY, "i4", None),  # not the canonical name, 'int32'
        (Kind.NUMPY, "(2,)f4", None),
        (Kind.NUMPY, "U" + "9" * 80, None),
        (Kind.NUMPY, "crafted_payload.Evil", None),
        (Kind.NUMPY_SCALAR, None, None),
        (Kind.PYTHON, "str", None),
        (Kind.PYTHON, "int64", None),
        (Kind.PRNG_KEY, "key<fry>", "fry"),
        (Kind.PRNG_KEY, "key<fry>", "rbg"),
        (Kind.PRNG_KEY, "uint32", "threefry2x32"),
        (Kind.JAX, "float32", "threefry2x32"),
    ],
)
def test_dtypes_outside_the_allow_list_are_refused(kind, dtype, impl):
    """Object, structured, non-canonical, unknown or mismatched dtypes and impls: ValueError."""
    with pytest.raises(ValueError, match=r"is not|is given for"):
        dtypes.check(kind, dtype, impl)


def test_each_prng_implementation_is_allowed_with_its_dtype():
    """Every known implementation's keys have the dtype the allow-list expects."""
    for impl in dtypes.PRNG_IMPLS:
        key = jax.random.key(0, impl=impl)
        assert dtypes.check(Kind.PRNG_KEY, str(key.dtype), str(jax.random.key_impl(key))) is None
