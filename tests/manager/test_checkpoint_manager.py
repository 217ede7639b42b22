"""CheckpointManager: layout, async saves, commit visibility, round trips and errors."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import jaxjob
from jaxjob._src.manager import lock


def _tree():
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)}
    return {
        "params": params,
        "opt_state": optax.adam(1e-3).init(params),
        "rng": jax.random.key(42),
        "cursor": np.array([3, 4], np.int32),
        "step": 7,
        "lr": 0.5,
        "flag": True,
        "np_scalar": np.float32(2.5),
    }


def _assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert type(x) is type(y)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert x.dtype == y.dtype
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).dtype == np.asarray(y).dtype


def test_round_trip_with_targets_keeps_types(tmp_path):
    """NamedTuple states, typed keys, bfloat16, NumPy and Python leaves round-trip exactly."""
    tree = _tree()
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, tree)
    ckpt.wait_until_finished()
    assert os.path.isdir(tmp_path / "local.0")
    targets = {
        k: jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree[k]
        )
        for k in ("params", "opt_state", "rng")
    }
    _assert_same(dict(ckpt.load(0, targets=targets)), tree)


def test_restore_without_model_code_keeps_leaf_types(tmp_path):
    """Without targets, containers come back as dicts/lists but every leaf keeps its type."""
    tree = _tree()
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(3, tree)
    ckpt.wait_until_finished()
    restored = jaxjob.restore(str(tmp_path))
    for name in ("params", "rng", "cursor", "step", "lr", "flag", "np_scalar"):
        _assert_same(restored[name], tree[name])
    assert restored["opt_state"][0]["count"].dtype == jnp.int32


def test_donation_and_async_save_keep_each_epochs_values(tmp_path):
    """Each epoch's checkpoint holds its own values though the next epoch donates the buffers."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros((256, 256))})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    jaxjob.epoch_limiter(job, 5)
    session = jaxjob.Session()
    assert jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(session) == 5
    for epoch in range(6):
        x = jaxjob.restore(str(tmp_path), epoch=epoch, leaves=["x"])["x"]
        assert float(x.min()) == float(x.max()) == epoch


def test_a_step_donating_a_leaf_its_save_still_writes_leaves_the_checkpoint_exact(
    tmp_path, monkeypatch
):
    """No host copy on the CPU: the background write reads the workspace's own buffers
    (Orbax's zero-copy NumPy views of them), so a save holds no second copy of the workspace.
    A step that donates a buffer while its write still reads it does not get it (see the test
    below); once the write is done with it, the step may. Either way each checkpoint holds the
    values saved. (Whether the write still reads the buffer when the step runs depends on the
    disk and the load: it is not asserted.)"""
    from jaxjob._src.manager.save import background_start

    monkeypatch.setattr(background_start, "SMALL_SAVE_BYTES", 16 * 2**20)
    x = jnp.zeros(8 * 2**20, jnp.float32)  # 32 MiB: above SMALL_SAVE_BYTES, so not copied
    step = jax.jit(lambda a: a + 1, donate_argnums=0)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in range(3):
        ckpt.save(epoch, {"x": x})
        saved, x = x, step(x)  # donates the buffer the save may still be writing
        x.block_until_ready()
        if not saved.is_deleted():  # not donated: the write still referenced it
            assert float(saved[0]) == epoch
    ckpt.wait_until_finished()
    for epoch in range(3):
        restored = jaxjob.restore(str(tmp_path), epoch=epoch, leaves=["x"])["x"]
        assert float(restored.min()) == float(restored.max()) == epoch


def test_the_cpu_runtime_does_not_donate_a_buffer_a_numpy_view_still_references():
    """What lets a save on the CPU write the workspace's own buffers: XLA's CPU client gives a
    donating step a new buffer while a zero-copy NumPy view (Orbax's, or the checksum's) of the
    donated one is alive, and donates it once the view is gone."""
    if jax.default_backend() != "cpu":
        pytest.skip("an accelerator's save writes a host copy")
    step = jax.jit(lambda a: a + 1, donate_argnums=0)
    x = jnp.zeros(1024)
    view = np.asarray(x)  # what the write holds while it reads
    y = step(x)
    y.block_until_ready()
    assert not x.is_deleted() and view[0] == 0.0 and float(y[0]) == 1.0
    del view
    z = step(x)
    z.block_until_ready()
    assert x.is_deleted() and float(z[0]) == 1.0


def test_epoch_is_visible_only_when_committed(tmp_path):
    """An uncommitted (temporary) directory is never listed or resumed from."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"x": jnp.ones(3)})
    ckpt.wait_until_finished()
    (tmp_path / "local.1.orbax-checkpoint-tmp-123").mkdir()
    (tmp_path / "local.2").mkdir()  # no commit marker, no manifest
    assert ckpt.committed_epochs() == [0]
    assert ckpt.get_resume_from_epoch_id() is None  # set_params not called: no nodes known
    ckpt.set_params(nodes=["local"])
    assert ckpt.get_resume_from_epoch_id() == 0


def test_resave_of_a_committed_epoch_replaces_it(tmp_path):
    """Saving an epoch again replaces it once the new one is committed."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(1, {"x": jnp.zeros(2)})
    ckpt.save(1, {"x": jnp.ones(2)})
    ckpt.close()  # releases the writer's lock file, local.lock
    assert ckpt.load(1)["x"].tolist() == [1.0, 1.0]
    assert sorted(os.listdir(tmp_path)) == [".jaxjob", "local.1"]  # the superseded copy is gone
    assert os.listdir(tmp_path / ".jaxjob") == ["run.json"]  # the run id, kept without the lock


def test_missing_epoch_lists_committed_ones(tmp_path):
    """Loading an epoch that is not committed names the committed epochs."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in (0, 1):
        ckpt.save(epoch, {"x": jnp.ones(1)})
    ckpt.wait_until_finished()
    with pytest.raises(FileNotFoundError, match=r"epoch 7 .*committed epochs: \[0, 1\]"):
        ckpt.load(7)
    with pytest.raises(FileNotFoundError, match=r"epoch 7 .*committed epochs: \[0, 1\]"):
        jaxjob.restore(str(tmp_path), epoch=7)


def test_unknown_leaf_names_list_available(tmp_path):
    """Restoring unknown names raises KeyError listing what the checkpoint holds."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"params": jnp.ones(1), "opt_state": jnp.zeros(1)})
    ckpt.wait_until_finished()
    with pytest.raises(KeyError, match=r"\['parms'\].*available: \['opt_state', 'params'\]"):
        jaxjob.restore(str(tmp_path), leaves=["parms"])


def test_target_mismatch_names_the_key_path(tmp_path):
    """A target whose shape, dtype or structure differs names the key path."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"params": {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}})
    ckpt.wait_until_finished()
    sds = jax.ShapeDtypeStruct
    with pytest.raises(ValueError, match=r"\['params'\]\['w'\]: shape mismatch: target \(3, 3\)"):
        ckpt.load(
            0, targets={"params": {"w": sds((3, 3), jnp.float32), "b": sds((3,), jnp.float32)}}
        )
    with pytest.raises(ValueError, match=r"\['params'\]\['b'\]: dtype mismatch: target int32"):
        ckpt.load(0, targets={"params": {"w": sds((2, 3), jnp.float32), "b": sds((3,), jnp.int32)}})
    with pytest.raises(ValueError, match=r"structure mismatch for 'params'.*\['params'\]\['v'\]"):
        ckpt.load(
            0, targets={"params": {"w": sds((2, 3), jnp.float32), "v": sds((3,), jnp.float32)}}
        )


def test_unwritable_directory_raises_a_clear_error(tmp_path):
    """Saving under a regular file raises an OSError naming db_prefix; nothing committed is lost."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ckpt = jaxjob.CheckpointManager(str(blocker / "ckpt"))
    with pytest.raises(
        NotADirectoryError, match=r"db_prefix .*file/ckpt.* is not a writable directory"
    ):
        ckpt.save(0, {"x": jnp.ones(1)})
    assert [f.epoch for f in ckpt.tier("persistent").failures] == [0]


# DESIGN.md's manager methods, ``tier`` (the tiers' operations), and what the runner and users
# read: ``node_names``, ``options`` (timeout_s, host_map, ...), ``metadata_handler``
PUBLIC_NAMES = [
    "blob_list", "check_db_exists", "close", "collect_checkpoint_stats", "committed_epochs",
    "cp_accessible", "db_prefix", "get_ckpt_db_name", "get_resume_from_epoch_id", "init", "load",
    "load_blobs_from_checkpoint", "load_blobs_locally", "metadata_handler", "node_managers",
    "node_names", "options", "report_checkpoint_stats", "save", "set_params", "tier", "verify",
    "wait_until_finished", "write_checkpoint_metadata",
]  # fmt: skip


@pytest.mark.parametrize("manager", [jaxjob.CheckpointManager, jaxjob.MultiNodeCheckpointManager])
def test_public_names_are_the_documented_ones(manager):
    """A manager's public names are DESIGN's and a few more (at most 24), each with a docstring;
    per-tier operations live on ``manager.tier(name)``, not as one method per tier operation."""
    names = sorted(n for n in dir(manager) if not n.startswith("_"))
    assert names == PUBLIC_NAMES and len(names) <= 24
    assert [n for n in names if not (getattr(manager, n).__doc__ or "").strip()] == []


def test_bad_arguments():
    """Bad constructor arguments name the argument, the value and what is expected."""
    with pytest.raises(ValueError, match=r"db_type must be one of \('orbax',\), got 'minidb'"):
        jaxjob.CheckpointManager("/tmp/x", "n", "minidb")
    with pytest.raises(ValueError, match="on_save_error must be one of"):
        jaxjob.JobRunner(jaxjob.Job(), on_save_error="ignore")
    with pytest.raises(ValueError, match="handles one node"):
        jaxjob.CheckpointManager("/tmp/x").init(["a", "b"])


def test_multinode_reinit(tmp_path):
    """Re-init with the same nodes is a no-op; with other nodes a ValueError."""
    ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path))
    ckpt.init(["a", "b"])
    managers = ckpt.node_managers
    ckpt.init(["a", "b"])
    assert ckpt.node_managers == managers
    with pytest.raises(ValueError, match=r"initialised with nodes \['a', 'b'\], got nodes \['a'\]"):
        ckpt.init(["a"])


def test_multinode_stats_report_every_node(tmp_path):
    """report_checkpoint_stats aggregates each node's duration and bytes."""
    handler = jaxjob.DiskMetadataHandler()
    ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path), metadata_handler=handler)
    ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
    ckpt.save(0, {"x": jnp.zeros(1000), "y": jnp.zeros(10)})
    ckpt.report_checkpoint_stats("checkpoint_save")
    ckpt.wait_until_finished()
    stats = handler.history[-1]["stats"]
    assert set(stats) == {f"{tmp_path}/a.0", f"{tmp_path}/b.0"}
    assert stats[f"{tmp_path}/a.0"]["bytes"] == 4000
    assert stats[f"{tmp_path}/b.0"]["bytes"] == 40
    assert all(s["duration_s"] >= 0 for s in stats.values())


def test_private_node_round_trips_every_leaf_kind(tmp_path):
    """owner_process: a node stored host-side by one process comes back with exact types."""
    ws = {
        "w": jnp.arange(4, dtype=jnp.bfloat16),
        "key": jax.random.key(3),
        "cursor": np.array([5, 6], np.int64),
        "step": np.float64(0.25),
        "n": 7,
        "flag": True,
    }
    ckpt = jaxjob.CheckpointManager(str(tmp_path), "trainer_0", owner_process=0)
    ckpt.save(0, ws)
    ckpt.wait_until_finished()
    back = ckpt.load(0)
    assert back["w"].dtype == jnp.bfloat16 and back["w"].tolist() == ws["w"].tolist()
    assert jax.random.key_data(back["key"]).tolist() == jax.random.key_data(ws["key"]).tolist()
    assert back["cursor"].dtype == np.int64 and back["cursor"].tolist() == [5, 6]
    assert type(back["step"]) is np.float64 and back["step"] == 0.25
    assert type(back["n"]) is int and back["n"] == 7
    assert type(back["flag"]) is bool and back["flag"] is True


def test_private_node_arguments():
    """owner_process must name a process of the job."""
    with pytest.raises(
        ValueError, match=r"owner_process must be None or a process index in \[0, 1\), got 3"
    ):
        jaxjob.CheckpointManager("/tmp/x", owner_process=3)


def test_multinode_save_starts_no_node_when_one_cannot(tmp_path):
    """If one node's save cannot start, none does: an epoch is saved for every node or none."""
    ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path))
    ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
    with pytest.raises(TypeError, match=r"cannot checkpoint the leaf at \['y'\] of type object"):
        ckpt.save(0, {"x": jnp.zeros(2), "y": object()})
    ckpt.save(1, {"x": jnp.zeros(2), "y": jnp.ones(2)})
    ckpt.wait_until_finished()
    epochs = [p.name for p in tmp_path.iterdir() if p.is_dir() and p.name != lock.LOCK_DIR]
    assert sorted(epochs) == ["a.1", "b.1"]


class _Denying(jaxjob.DiskMetadataHandler):
    def cp_accessible(self, epoch=None):
        return False


@pytest.mark.parametrize("multinode", [False, True])
def test_save_after_access_denied_writes_nothing(tmp_path, multinode):
    """After cp_accessible() said False, the next save raises the PermissionError (the multi-node
    manager: as a CheckpointSaveError), writes nothing and leaves what is committed; the one after
    saves again."""
    if multinode:
        ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path), metadata_handler=_Denying())
        ckpt.init(["a"])
    else:
        ckpt = jaxjob.CheckpointManager(str(tmp_path), "a", metadata_handler=_Denying())
    ckpt.save(0, {"x": jnp.zeros(2)})
    ckpt.wait_until_finished()
    assert ckpt.cp_accessible() is False
    error = jaxjob.CheckpointSaveError if multinode else PermissionError
    with pytest.raises(error, match="reports the checkpoints .* as not accessible"):
        ckpt.save(0, {"x": jnp.ones(2)})
    ckpt.wait_until_finished()
    assert ckpt.committed_epochs() == [0] and ckpt.load(0)["x"].tolist() == [0.0, 0.0]
    ckpt.save(1, {"x": jnp.ones(2)})
    ckpt.wait_until_finished()
    assert ckpt.committed_epochs() == [0, 1]


@pytest.mark.parametrize("manager", [jaxjob.CheckpointManager, jaxjob.MultiNodeCheckpointManager])
def test_both_managers_accept_an_options_object(tmp_path, manager):
    """options=CheckpointOptions(...) configures either manager; beside it a keyword is refused."""
    options = jaxjob.CheckpointOptions(async_save=False, timeout_s=7.0)
    ckpt = manager(str(tmp_path), options=options)
    assert ckpt.options is options and ckpt.options.timeout_s == 7.0
    if manager is jaxjob.MultiNodeCheckpointManager:
        ckpt.init(["local"])
    ckpt.save(0, {"w": jnp.ones(2)})
    assert not ckpt.tier("persistent").has_pending()  # async_save=False
    assert ckpt.committed_epochs() == [0]
    ckpt.close()
    with pytest.raises(ValueError, match=r"timeout_s=5 given beside options="):
        manager(str(tmp_path), options=options, timeout_s=5)
    with pytest.raises(TypeError, match=r"options must be a jaxjob.CheckpointOptions, got dict"):
        manager(str(tmp_path), options={"timeout_s": 5})


class _Recording(jaxjob.DiskMetadataHandler):
    """Records the epochs whose commit the manager reports; denies access when told to."""

    def __init__(self):
        super().__init__()
        self.written, self.deny = [], False

    def write(self, epoch):
        self.written.append(epoch)
        super().write(epoch)

    def cp_accessible(self, epoch=None):
        return not self.deny


@pytest.mark.parametrize("multinode", [False, True])
def test_a_metadata_record_waits_for_its_commit_through_a_refused_save(tmp_path, multinode):
    """A save refused by cp_accessible finishes nothing: the record of the save in flight is
    written once that save has committed, not when the refused save returns."""
    handler = _Recording()
    if multinode:
        ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path), metadata_handler=handler)
        ckpt.init(["local"])
    else:
        ckpt = jaxjob.CheckpointManager(str(tmp_path), metadata_handler=handler)
    ckpt.save(0, {"x": jnp.zeros(2)})
    ckpt.write_checkpoint_metadata(0)
    handler.deny = True
    assert ckpt.cp_accessible() is False
    with pytest.raises((PermissionError, jaxjob.CheckpointSaveError), match="not accessible"):
        ckpt.save(1, {"x": jnp.ones(2)})
    assert ckpt.tier("persistent").has_pending() and handler.written == []  # 0 is in flight
    ckpt.wait_until_finished()
    assert handler.written == [0] and ckpt.committed_epochs() == [0]
    ckpt.close()


def test_a_failed_write_drops_its_metadata_record(tmp_path, monkeypatch):
    """A save whose background write failed never gets a commit record, even when the round
    that found the failure ends before the manager writes records (here: by hand)."""
    handler = _Recording()
    ckpt = jaxjob.CheckpointManager(str(tmp_path), metadata_handler=handler)
    ckpt.save(0, {"x": jnp.zeros(2)})
    ckpt.write_checkpoint_metadata(0)
    real = ocp.AsyncCheckpointer.wait_until_finished

    def failing(self):
        real(self)
        raise OSError("injected: disk full")

    monkeypatch.setattr(ocp.AsyncCheckpointer, "wait_until_finished", failing)
    (writer,) = ckpt.tier("persistent").writers
    assert writer.finish().epoch == 0  # the failure found, as a round's prepare finds it
    monkeypatch.setattr(ocp.AsyncCheckpointer, "wait_until_finished", real)
    assert ckpt.tier("persistent").finish() == []  # nothing in flight any more
    assert handler.written == []
    ckpt.close()


def test_verify_reads_the_path_prefix_checkpoints(tmp_path):
    """With set_params(path_prefix=...), verify and the resume decision read those checkpoints."""
    saved = tmp_path / "saved"
    ckpt = jaxjob.CheckpointManager(str(saved))
    ckpt.save(0, {"x": jnp.zeros(2)})
    ckpt.close()
    reader = jaxjob.CheckpointManager(str(tmp_path / "other"))
    reader.set_params(["local"], path_prefix=f"{saved}/")
    assert reader.committed_epochs() == [0]
    assert reader.verify(0) == [] and reader.get_resume_from_epoch_id() == 0
