"""Names that are not strings and ints a checkpoint cannot hold: clear errors, nothing written."""

import os
import re

import jax
import jax.numpy as jnp
import pytest

import jaxjob


@pytest.fixture
def prefix(tmp_path):
    """A db_prefix with epoch 0 ({"w": [1, 1]}) committed."""
    path = str(tmp_path / "ckpt")
    ckpt = jaxjob.CheckpointManager(path)
    ckpt.save(0, {"w": jnp.ones(2)})
    ckpt.close()
    return path


def saved(prefix, epoch, workspace):
    ckpt = jaxjob.CheckpointManager(prefix)
    try:
        ckpt.save(epoch, workspace)
        ckpt.wait_until_finished()
    finally:
        ckpt.close()


@pytest.mark.parametrize("key", [3, (1, 2)], ids=["int", "tuple"])
def test_a_top_level_name_that_is_not_a_str_is_refused_on_save(prefix, key):
    """save(epoch, {3: x}): TypeError naming the argument, the key and that names are str."""
    with pytest.raises(
        TypeError, match=rf"workspace: names must be non-empty strings, got {re.escape(repr(key))} "
    ):
        saved(prefix, 1, {key: jnp.ones(2)})
    assert not os.path.exists(os.path.join(prefix, "local.1"))


@pytest.mark.parametrize("key", [3, (1, 2)], ids=["int", "tuple"])
def test_a_restore_naming_a_leaf_with_a_non_str_is_refused(prefix, key):
    """restore(leaves=[3]) and restore(target={3: ...}): TypeError naming the argument."""
    with pytest.raises(
        TypeError, match=rf"leaves: names must be non-empty strings, got {re.escape(repr(key))} "
    ):
        jaxjob.restore(prefix, leaves=[key])
    like = {key: jax.ShapeDtypeStruct((2,), jnp.float32)}
    with pytest.raises(
        TypeError, match=rf"target: names must be non-empty strings, got {re.escape(repr(key))} "
    ):
        jaxjob.restore(prefix, target=like)


@pytest.mark.parametrize("jit", [True, False], ids=["jitted", "host"])
def test_a_task_returning_a_non_str_name_is_told_names_are_str(tmp_path, jit):
    """An init task returning {(1, 2): x}: the error names the task, the key and the rule."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {(1, 2): jnp.ones(2)}, jit=jit, name="init")
    jaxjob.epoch_limiter(job, 1)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path)))
    with pytest.raises(TypeError, match=r"task 'init' returned the name \(1, 2\) \(tuple\)"):
        runner.train(jaxjob.Session())


@pytest.mark.parametrize(
    "workspace, where",
    [
        ({"a": {"b": 2**70}}, r"\['a'\]\['b'\]"),
        ({"a": [1, -(2**63) - 1]}, r"\['a'\]\[1\]"),
    ],
    ids=["2**70", "below-int64"],
)
def test_a_python_int_outside_int64_names_its_key_path_and_the_range(prefix, workspace, where):
    """A Python int leaf that does not fit int64: an error naming the key path and the range;
    nothing is written, epoch 0 still restores."""
    with pytest.raises(TypeError, match=rf"the Python int at {where} .* outside int64's range"):
        saved(prefix, 1, workspace)
    assert not os.path.exists(os.path.join(prefix, "local.1"))
    assert jaxjob.restore(prefix)["w"].tolist() == [1.0, 1.0]


def test_python_ints_at_the_ends_of_int64_are_saved(prefix):
    """-2**63 and 2**63 - 1 fit: saved and restored exactly."""
    saved(prefix, 1, {"w": jnp.ones(2), "ends": [-(2**63), 2**63 - 1]})
    assert jaxjob.restore(prefix, epoch=1)["ends"] == [-(2**63), 2**63 - 1]
