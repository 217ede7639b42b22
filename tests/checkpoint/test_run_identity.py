"""Run identity: one id per db_prefix, kept beside the locks, recorded in every checkpoint."""

import json
import os
import shutil
import threading

import jax.numpy as jnp
import pytest

import jaxjob
from jaxjob._src.base import fs
from jaxjob._src.checkpoint import manifest, run_identity


def _save(prefix, epochs, value=1.0, **kwargs):
    ckpt = jaxjob.CheckpointManager(prefix, **kwargs)
    for epoch in epochs:
        ckpt.save(epoch, {"x": jnp.full(2, value + epoch)})
    ckpt.close()


def test_a_fresh_prefix_has_no_run_until_ensured(tmp_path):
    """read gives None; ensure creates one id, the same on every later call."""
    prefix = str(tmp_path)
    assert run_identity.read(prefix) is None
    run = run_identity.ensure(prefix)
    assert run_identity.ensure(prefix) == run_identity.read(prefix) == run
    assert os.listdir(tmp_path / ".jaxjob") == ["run.json"]


def test_racing_ensures_agree_on_one_id(tmp_path):
    """Eight threads creating the run file at once all get the id that one of them wrote."""
    prefix, runs = str(tmp_path), []
    threads = [
        threading.Thread(target=lambda: runs.append(run_identity.ensure(prefix))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runs) == 8 and len(set(runs)) == 1
    assert os.listdir(tmp_path / ".jaxjob") == ["run.json"]  # no temporary file left


def test_create_only_never_replaces(tmp_path):
    """fs.create_only writes a new file once; a second write is refused and changes nothing."""
    path = str(tmp_path / "f")
    assert fs.create_only(path, "first") and not fs.create_only(path, "second")
    assert fs.read_text(path) == "first"


def test_every_save_records_the_prefix_run_and_closing_keeps_it(tmp_path):
    """Each node's manifests record the prefix's run; releasing the locks keeps the run file."""
    prefix = str(tmp_path)
    ckpt = jaxjob.MultiNodeCheckpointManager(prefix)
    ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
    ckpt.save(0, jaxjob.Workspace({"x": jnp.ones(2), "y": jnp.zeros(2)}))
    ckpt.close()
    run = run_identity.read(prefix)
    assert [manifest.read(str(tmp_path / n)).run for n in ("a.0", "b.0")] == [run, run]
    assert os.listdir(tmp_path / ".jaxjob") == ["run.json"]  # the locks are gone, the run stays
    _save(prefix, [1], node_name="a")
    assert manifest.read(str(tmp_path / "a.1")).run == run


def test_a_prefix_copied_without_its_run_file_adopts_its_newest_checkpoint(tmp_path):
    """No .jaxjob folder (a copy of the visible files): restores pass; the next save adopts."""
    source, prefix = str(tmp_path / "source"), str(tmp_path / "copy")
    _save(source, [0, 1])
    shutil.copytree(source, prefix, ignore=shutil.ignore_patterns(".jaxjob"))
    assert run_identity.read(prefix) is None
    assert jaxjob.restore(prefix)["x"].tolist() == [2.0, 2.0]
    _save(prefix, [2])
    assert run_identity.read(prefix) == run_identity.read(source)
    assert jaxjob.restore(prefix, epoch=0)["x"].tolist() == [1.0, 1.0]
    assert jaxjob.CheckpointManager(prefix).verify(1) == []


def test_check_refuses_a_manifest_of_another_run(tmp_path):
    """check passes the prefix's own manifests and names both runs for another run's."""
    mine, other = str(tmp_path / "mine"), str(tmp_path / "other")
    _save(mine, [0])
    _save(other, [0])
    run_identity.check(manifest.read(os.path.join(mine, "local.0")), mine)
    foreign = manifest.read(os.path.join(other, "local.0"))
    with pytest.raises(jaxjob.CorruptCheckpointError, match=rf"saved by run {foreign.run}, but"):
        run_identity.check(foreign, mine)


@pytest.mark.parametrize("text", ["", "{", '{"run": "x"}', "[]", '{"run": 5}'])
def test_a_damaged_run_file_is_named_with_its_fix(tmp_path, text):
    """A run file that is not a run id: reads through the prefix raise a ValueError saying so."""
    prefix = str(tmp_path)
    _save(prefix, [0])
    with open(run_identity.run_file(prefix), "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match=r"the run file '.*run.json' is damaged .*remove it"):
        jaxjob.restore(prefix)
    os.remove(run_identity.run_file(prefix))
    assert jaxjob.restore(prefix)["x"].tolist() == [1.0, 1.0]


def test_the_evidence_is_the_run_file_then_the_log_then_the_manifests(tmp_path):
    """Each record is used only when those before it are gone; a log not UTF-8 is passed over."""
    prefix = str(tmp_path)
    _save(prefix, [0, 1])
    run = run_identity.read(prefix)
    handler = jaxjob.DiskMetadataHandler()
    handler.set_params(db_prefix=prefix, db_type="orbax", node_names=["local"])
    handler.write(1)
    log = os.path.join(prefix, run_identity.LOG_FILE)
    with open(log) as f:
        assert json.loads(f.readline())["run"] == run  # every commit record names the run
    assert run_identity.evidence(prefix) == (run, run_identity.run_file(prefix))
    os.remove(run_identity.run_file(prefix))
    assert run_identity.evidence(prefix) == (run, f"the metadata log {log}")
    with open(log, "wb") as f:
        f.write(b"\xff\xfe not a log")
    assert run_identity.evidence(prefix)[0] == run  # the two manifests agree
    os.remove(log)
    os.symlink("/dev/zero", log)  # endless: never read (a save's first adoption would hang)
    assert run_identity.evidence(prefix)[0] == run
    shutil.rmtree(os.path.join(prefix, "local.0"))
    shutil.rmtree(os.path.join(prefix, "local.1"))
    assert run_identity.evidence(prefix) == (None, "")  # nothing left: a new run may start
