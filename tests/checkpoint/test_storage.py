"""The storage layer: the leaf codec and manifest, paths, format, and what one resume costs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import jaxjob
from jaxjob._src.base import fs
from jaxjob._src.checkpoint import manifest


def _assert_equal_trees(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert type(x) is type(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).dtype == np.asarray(y).dtype


def _save_and_restore(tmp_path, tree, **kwargs):
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, tree)
    ckpt.close()
    return jaxjob.restore(str(tmp_path), **kwargs)


AWKWARD = {
    "int_keys": lambda: {i: jnp.full((2,), i, jnp.int32) for i in range(13)},
    "nested_sequences": lambda: [
        jnp.ones(2),
        (jnp.zeros(1), None, [np.int32(3), None, ()]),
        {"x": None, "y": (1.5,)},
        [],
    ],
    "mixed_leaf_kinds": lambda: {"a": 1, "b": True, "c": np.float16(2.0), "d": np.arange(3)},
    "empty_dict": lambda: {},
    "none": lambda: None,
}


@pytest.mark.parametrize("case", sorted(AWKWARD))
def test_awkward_trees_round_trip_without_model_code(tmp_path, case):
    """Dicts with int keys, lists vs tuples, None and empty containers come back exactly."""
    tree = {case: AWKWARD[case]()}
    restored = _save_and_restore(tmp_path, tree)
    _assert_equal_trees(dict(restored), tree)
    assert jax.tree.leaves(dict(restored)) is not None


def test_int_keys_stay_ints_in_numeric_order(tmp_path):
    """Thirteen int keys come back as ints, leaf order 0, 1, ..., 12 (not '0', '1', '10', ...)."""
    layers = {i: {"w": jnp.full((1,), float(i))} for i in range(13)}
    restored = _save_and_restore(tmp_path, {"layers": layers})["layers"]
    assert list(restored) == list(range(13))
    assert [float(x[0]) for x in jax.tree.leaves(restored)] == [float(i) for i in range(13)]


def test_dotted_and_slashed_names_never_collide_with_nested_keys(tmp_path):
    """'a.b', 'a/b' and {'a': {'b'}} are three distinct leaves."""
    tree = {"a.b": jnp.array([1.0]), "a": {"b": jnp.array([2.0])}, "a/b": jnp.array([3.0])}
    restored = _save_and_restore(tmp_path, tree)
    assert float(restored["a.b"][0]) == 1.0
    assert float(restored["a"]["b"][0]) == 2.0
    assert float(restored["a/b"][0]) == 3.0
    only = _save_and_restore(tmp_path / "2", tree, leaves=["a.b"])
    assert sorted(only) == ["a.b"]


def test_namedtuples_come_back_as_dicts_of_their_fields(tmp_path):
    """An optax state without model code: tuples stay tuples, NamedTuples become dicts."""
    state = optax.adam(1e-3).init({"w": jnp.ones(2)})
    restored = _save_and_restore(tmp_path, {"opt": state})["opt"]
    assert type(restored) is tuple and len(restored) == 2
    assert sorted(restored[0]) == ["count", "mu", "nu"]
    assert restored[1] == {}
    np.testing.assert_array_equal(restored[0]["mu"]["w"], state[0].mu["w"])


def test_leaf_names_are_stored_flat_and_unique(tmp_path):
    """The manifest maps each key path to its own stored name and keeps the structure."""
    tree = {"a.b": jnp.ones(1), "a": {"b": jnp.ones(1)}}
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, tree)
    ckpt.close()
    found = manifest.read(str(tmp_path / "local.0"))
    paths = sorted(spec.path for spec in found.leaves.values())
    assert paths == ["['a']['b']", "['a.b']"]
    assert len({spec.name for spec in found.leaves.values()}) == 2
    assert found.state_keys == ["a", "a.b"]


def test_an_older_format_is_refused_clearly(tmp_path):
    """A checkpoint whose manifest has another format version gets a ValueError naming both."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"x": jnp.ones(1)})
    ckpt.close()
    file = tmp_path / "local.0" / manifest.MANIFEST_ITEM / manifest.MANIFEST_FILE
    doc = json.loads(file.read_text())
    file.write_text(json.dumps({**doc, "format": 2}))
    reads = f"checkpoint format 2; this jaxjob reads format {manifest.FORMAT}"
    with pytest.raises(ValueError, match=reads):
        jaxjob.restore(str(tmp_path))


@pytest.mark.parametrize("prefix", ["ftp://host/run", "hdfs://x/y", "file:///tmp/x"])
def test_an_unsupported_scheme_is_an_error_not_a_local_directory(tmp_path, prefix):
    """A scheme jaxjob cannot write to raises before anything is written."""
    os.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"db_prefix .* uses the scheme .*supports local paths"):
        jaxjob.CheckpointManager(prefix)
    assert os.listdir(tmp_path) == []


def test_tilde_in_db_prefix_is_expanded(tmp_path, monkeypatch):
    """'~/runs' means the home directory, not a directory named '~'."""
    monkeypatch.setenv("HOME", str(tmp_path))
    ckpt = jaxjob.CheckpointManager("~/runs")
    assert ckpt.db_prefix == str(tmp_path / "runs")


def test_checkpoint_without_its_commit_marker_is_never_listed_or_loaded(tmp_path):
    """Removing commit_success.txt makes an epoch invisible to listing, resume and restore."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in (0, 1):
        ckpt.save(epoch, {"x": jnp.full(1, float(epoch))})
    ckpt.close()
    os.remove(tmp_path / "local.1" / "commit_success.txt")
    assert ckpt.committed_epochs() == [0]
    assert float(jaxjob.restore(str(tmp_path))["x"][0]) == 0.0
    with pytest.raises(FileNotFoundError, match="not a committed checkpoint"):
        jaxjob.restore(str(tmp_path / "local.1"))


def _counting(monkeypatch):
    counts = {"manifest": 0, "opened": 0, "closed": 0}
    read = manifest.read

    def counted_read(path):
        counts["manifest"] += 1
        return read(path)

    monkeypatch.setattr(manifest, "read", counted_read)
    for cls in (ocp.Checkpointer, ocp.AsyncCheckpointer):
        init, close = cls.__init__, cls.close

        def counted_init(self, *args, _init=init, _cls=cls, **kwargs):
            counts["opened"] += type(self) is _cls
            _init(self, *args, **kwargs)

        def counted_close(self, _close=close, _cls=cls):
            counts["closed"] += type(self) is _cls
            _close(self)

        monkeypatch.setattr(cls, "__init__", counted_init)
        monkeypatch.setattr(cls, "close", counted_close)
    return counts


def _job(epochs):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(3), "rng": jax.random.key(0)})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "loss": ws["x"].sum()})
    jaxjob.epoch_limiter(job, epochs)
    job.add_stop_condition(lambda ws: bool(ws["loss"] > 100))
    return job


def test_one_resume_reads_the_manifest_once_and_closes_every_orbax_object(tmp_path, monkeypatch):
    """Resuming reads the manifest once and every Orbax checkpointer it opens is closed."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    jaxjob.JobRunner(_job(2), ckpt).train(jaxjob.Session())
    ckpt.close()
    counts = _counting(monkeypatch)
    resumed = jaxjob.CheckpointManager(str(tmp_path))
    session = jaxjob.Session()
    assert jaxjob.JobRunner(_job(3), resumed, on_save_error="raise").train(session) == 3
    before_close = dict(counts)
    resumed.close()
    assert counts["manifest"] == 1, before_close
    assert counts["opened"] == counts["closed"] == 2  # one reader, one async writer
    assert session.workspace["x"].tolist() == [3.0, 3.0, 3.0]


def test_restore_function_closes_its_orbax_objects(tmp_path, monkeypatch):
    """jaxjob.restore opens one checkpointer per directory and closes it."""
    _save_and_restore(tmp_path, {"x": jnp.ones(2)})
    counts = _counting(monkeypatch)
    jaxjob.restore(str(tmp_path))
    assert counts == {"manifest": 1, "opened": 1, "closed": 1}


def test_fs_normalize_examples():
    """Object-store prefixes lose their trailing slash; local paths become absolute."""
    assert fs.normalize("s3://b/run/") == "s3://b/run"
    assert os.path.isabs(fs.normalize("runs/x"))
    with pytest.raises(TypeError, match="db_prefix must be a non-empty path"):
        fs.normalize("", "db_prefix")


@pytest.mark.parametrize("sync", [True, False])
def test_fs_append_text_creates_appends_and_isolates_a_torn_line(tmp_path, sync):
    """Appends start on a new line even after a crash tore the last one (with or without
    fsync); fsync_tree counts all."""
    path = str(tmp_path / "log.jsonl")
    fs.append_text(path, '{"epoch": 0}\n', sync=sync)
    fs.append_text(path, '{"epoch": 1}\n', sync=sync)
    with open(path, "a") as f:
        f.write('{"epo')  # a crash in the middle of an append
    fs.append_text(path, '{"epoch": 2}\n', sync=sync)
    assert (tmp_path / "log.jsonl").read_text().splitlines() == [
        '{"epoch": 0}',
        '{"epoch": 1}',
        '{"epo',
        '{"epoch": 2}',
    ]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    assert fs.fsync_tree(str(tmp_path)) == 4  # two files, two directories


@pytest.mark.parametrize(
    ("shape", "dtype"), [((), "int32"), ((0, 5), "float32"), ((3, 7), "bfloat16"), ((9,), "bool")]
)
def test_restore_buffers_are_aligned_so_cpu_device_put_uses_them_in_place(shape, dtype):
    """Read buffers start on 64 bytes: XLA's CPU client then takes them without a copy."""
    from jaxjob._src.internals import restore_buffers

    out = restore_buffers.aligned_zeros(shape, jnp.dtype(dtype))
    assert out.shape == shape and out.dtype == jnp.dtype(dtype) and not out.any()
    assert out.flags.c_contiguous and out.flags.writeable
    if out.size:  # an empty array has no data to place
        assert out.ctypes.data % 64 == 0
        placed = jax.device_put(out, jax.devices("cpu")[0])
        assert placed.unsafe_buffer_pointer() == out.ctypes.data  # in place, not copied


def test_restored_values_match_through_the_aligned_read(tmp_path):
    """Floats, bfloat16, a scalar and a PRNG key restore bit for bit through the aligned read."""
    ws = {
        "f": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 7,
        "b": jnp.arange(5, dtype=jnp.bfloat16),
        "i": jnp.int32(7),
        "k": jax.random.key(1),
    }
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, ws)
    ckpt.close()
    back = jaxjob.restore(str(tmp_path))
    for name in ["f", "b", "i"]:
        np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(ws[name]))
        assert back[name].dtype == ws[name].dtype
    assert jnp.array_equal(jax.random.key_data(back["k"]), jax.random.key_data(ws["k"]))
