"""Checksums: damaged checkpoints are caught on restore and by verify; auto-resume falls back."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import exact_job
import jax
import jax.numpy as jnp
import numpy as np
import paths
import pytest
from damage import (
    damage_manifest,
    delete,
    flip_bytes,
    flip_file,
    largest_data_file,
    read,
    save_epochs,
    truncate,
    write,
)

import jaxjob
from jaxjob._src.checkpoint import checksum, verify

SCRIPT = os.path.join(paths.JOBS, "exact_job.py")


CORRUPTIONS = {
    "flip": flip_bytes,
    "truncate": truncate,
    "delete": delete,
    "manifest": damage_manifest,
}
# What the error names for each: the big leaf (all data corruptions) or the manifest file.
NAMED = {
    "flip": r"leaf w \(\['w'\].*epoch 1 in '.*local\.1/state.*(checksum mismatch|unreadable)",
    "truncate": r"leaf w \(\['w'\].*epoch 1 in '.*local\.1/state.*unreadable",
    "delete": r"leaf w \(\['w'\].*epoch 1 in '.*local\.1/state.*unreadable",
    "manifest": r"epoch 1 at '.*local\.1' is corrupt: the manifest '.*manifest\.json' fails",
}


def _workspace(scale):
    return {
        "w": jax.random.normal(jax.random.key(scale), (64, 32)) * scale,  # the largest leaf
        "rng": jax.random.key(scale),
        "half": jnp.full((5,), scale, jnp.bfloat16),
        "cursor": np.int64(7 * scale),
        "steps": scale,
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A db_prefix with two committed epochs, 0 and 1, of the same structure."""
    return save_epochs(tmp_path_factory.mktemp("saved"), lambda e: _workspace(e + 1))


def _copy(saved, tmp_path):
    prefix = str(tmp_path / "ckpt")
    shutil.copytree(saved, prefix)
    return prefix


def test_an_intact_checkpoint_verifies_and_records_every_leaf(saved):
    """Every stored leaf has a checksum record; verify finds nothing and restore succeeds."""
    path = os.path.join(saved, "local.1")
    doc = json.loads(read(os.path.join(path, "jaxjob", "manifest.json")))
    assert doc["checksums"] == {
        "algorithm": "crc32c",
        "files": ["checksums.0.json"],
    }
    assert doc["self_checksum"] == checksum.doc_checksum(doc)
    records = json.loads(read(os.path.join(path, "jaxjob", "checksums.0.json")))
    assert sorted(records["leaves"]) == sorted(leaf["name"] for leaf in doc["leaves"])
    assert verify.verify_checkpoint(path) == []
    assert jaxjob.CheckpointManager(saved).verify(1) == []
    restored = jaxjob.restore(path)
    np.testing.assert_array_equal(restored["w"], _workspace(2)["w"])


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_damaged_checkpoint_fails_restore_naming_leaf_epoch_and_file(saved, tmp_path, kind):
    """Restore and load raise CorruptCheckpointError naming the leaf, the epoch and the file."""
    prefix = _copy(saved, tmp_path)
    CORRUPTIONS[kind](os.path.join(prefix, "local.1"))
    with pytest.raises(jaxjob.CorruptCheckpointError, match=NAMED[kind]):
        jaxjob.restore(prefix)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=NAMED[kind]):
        jaxjob.CheckpointManager(prefix).load(1)
    assert jaxjob.restore(prefix, epoch=0)["steps"] == 1  # the other epoch is untouched


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_verify_reports_one_line_per_damaged_leaf(saved, tmp_path, kind):
    """verify_checkpoint and verify(epoch) give one line naming the damaged leaf or manifest."""
    prefix = _copy(saved, tmp_path)
    path = os.path.join(prefix, "local.1")
    damaged = largest_data_file(path) if kind != "manifest" else "manifest.json"
    CORRUPTIONS[kind](path)
    lines = verify.verify_checkpoint(path)
    assert len(lines) == 1
    assert re.search(NAMED[kind], lines[0]), lines
    assert damaged in lines[0]  # the very file
    manager = jaxjob.CheckpointManager(prefix)
    assert manager.verify(1) == lines
    assert manager.verify(0) == []


def test_a_damaged_checksum_file_is_reported(saved, tmp_path):
    """A checksum file edited by hand, or deleted, makes the checkpoint corrupt."""
    prefix = _copy(saved, tmp_path)
    file = os.path.join(prefix, "local.1", "jaxjob", "checksums.0.json")
    doc = json.loads(read(file))
    doc["leaves"][next(iter(doc["leaves"]))][0][1] ^= 1
    write(file, json.dumps(doc))
    with pytest.raises(jaxjob.CorruptCheckpointError, match="checksums.0.json' fails its checksum"):
        jaxjob.restore(prefix)
    os.remove(file)
    (line,) = verify.verify_checkpoint(os.path.join(prefix, "local.1"))
    assert "checksums.0.json' is missing" in line


# ---- auto-resume falls back to the newest intact epoch, exactly ------------------------------


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_auto_resume_falls_back_to_the_newest_intact_epoch_exactly(
    reference, tmp_path, caplog, kind
):
    """Last epoch damaged: auto-resume logs and reports it, reruns it, ends bitwise equal."""
    prefix = _copy(reference / "ckpt", tmp_path)
    last = exact_job.EPOCHS
    CORRUPTIONS[kind](os.path.join(prefix, f"local.{last}"))
    handler = jaxjob.DiskMetadataHandler()
    with caplog.at_level(logging.WARNING, logger="jaxjob"):
        finished, workspace = exact_job.train(prefix, handler)
    assert finished == last
    assert f"The checkpoint of epoch {last} is damaged" in caplog.text
    (report,) = [h for h in handler.history if h["action"] == "checkpoint_verify"]
    (entry,) = report["stats"].values()
    assert entry["epoch"] == last and f"epoch {last}" in entry["error"]
    loads = [h for h in handler.history if h["action"] == "checkpoint_load"]
    assert [s["epoch"] for h in loads for s in h["stats"].values()] == [last - 1]
    exact_job.dump(workspace, tmp_path / "out.npz")
    exact_job.assert_same_workspace(reference / "out.npz", tmp_path / "out.npz")
    assert jaxjob.CheckpointManager(prefix).verify(last) == []


@pytest.mark.slow
def test_a_restarted_child_process_falls_back_exactly(reference, tmp_path):
    """A new process resuming from a run whose last epoch has flipped bytes ends bitwise equal."""
    prefix = _copy(reference / "ckpt", tmp_path)
    flip_bytes(os.path.join(prefix, f"local.{exact_job.EPOCHS}"))
    proc = subprocess.run(
        [sys.executable, SCRIPT, prefix, str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"finished at epoch {exact_job.EPOCHS}" in proc.stdout
    assert f"The checkpoint of epoch {exact_job.EPOCHS} is damaged" in proc.stderr
    exact_job.assert_same_workspace(reference / "out.npz", tmp_path / "out.npz")


def test_every_epoch_damaged_refuses_to_resume(saved, tmp_path):
    """If no committed epoch is intact, auto-resume raises instead of starting over."""
    prefix = _copy(saved, tmp_path)
    for epoch in (0, 1):
        flip_bytes(os.path.join(prefix, f"local.{epoch}"))
    ckpt = jaxjob.CheckpointManager(prefix)
    ckpt.set_params(nodes=["local"])
    with pytest.raises(
        jaxjob.CorruptCheckpointError, match="every committed checkpoint .* epoch 1"
    ):
        ckpt.get_resume_from_epoch_id()
    assert ckpt.committed_epochs() == [0, 1]  # nothing deleted


def test_multi_node_manager_verifies_each_node_and_falls_back(tmp_path):
    """MultiNodeCheckpointManager.verify names the damaged node; resume skips that epoch."""
    prefix = str(tmp_path / "ckpt")
    ckpt = jaxjob.MultiNodeCheckpointManager(prefix)
    ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
    for epoch in (0, 1):
        ckpt.save(epoch, jaxjob.Workspace({"x": jnp.arange(2048.0) + epoch, "y": jnp.ones(2)}))
    ckpt.close()
    flip_file(largest_data_file(os.path.join(prefix, "a.1")))
    (line,) = ckpt.verify(1)
    assert re.search(r"leaf x \(\['x'\].*epoch 1 in '.*/a\.1/state", line)
    assert ckpt.verify(0) == []
    fresh = jaxjob.MultiNodeCheckpointManager(prefix)
    fresh.set_params(nodes=["a", "b"])  # before init, as the runner asks
    assert fresh.get_resume_from_epoch_id() == 0


def test_a_checkpoint_deleted_while_it_is_checked_is_missing_not_corrupt(saved, tmp_path):
    """Retention of another process deleting the epoch: FileNotFoundError, not corruption."""
    from jaxjob._src.checkpoint import files

    prefix = _copy(saved, tmp_path)
    path = os.path.join(prefix, "local.1")
    shutil.rmtree(path)
    with pytest.raises(FileNotFoundError, match="was deleted while it was being read"):
        files.check(path)


def test_on_local_disk_the_leaves_are_hashed_once_written_and_flushed_by_the_commit(
    tmp_path, monkeypatch
):
    """The hash starts at the commit, when every data file is written (not beside the write).

    Hashed while Orbax wrote, the hash took CPU and memory bandwidth from the write
    (``benchmarks/checksum_cost.py``). Its checksum file is written before the commit's
    one flush of the whole directory, which flushes it with the rest.
    """
    from jaxjob._src.base import fs

    seen = []
    compute, flush = checksum._compute, fs.flush_tree

    def hashed(shards):
        data = [p for p in tmp_path.glob("local.0.orbax-checkpoint-tmp*/state/**/*") if p.is_file()]
        seen.append(("hash", sum(p.stat().st_size for p in data)))
        return compute(shards)

    def flushed(path):
        sums = os.path.join(path, "jaxjob", "checksums.0.json")
        seen.append(("flush", os.path.exists(sums)))
        return flush(path)

    monkeypatch.setattr(checksum, "_compute", hashed)
    monkeypatch.setattr(fs, "flush_tree", flushed)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.arange(100_000.0)})
    ckpt.wait_until_finished()
    assert [kind for kind, _ in seen] == ["hash", "flush"]
    assert dict(seen)["hash"] >= 400_000  # the 100,000 float32 values were written before
    assert dict(seen)["flush"] is True  # the checksum file is flushed with the rest
    assert ckpt.verify(0) == []
    assert os.path.exists(tmp_path / "local.0" / "jaxjob" / "checksums.0.json")
    ckpt.close()


def test_a_save_failing_before_its_commit_leaves_no_host_copies_behind(tmp_path, monkeypatch):
    """The host copies held for a commit's hash are let go when that save fails first.

    And the same epoch saved again commits (a stale entry for the same temporary
    directory would have written the checksum file twice).
    """
    from jaxjob._src.base import faults
    from jaxjob._src.internals import orbax_commit

    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.commit:1")
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.arange(1000.0)})
    with pytest.raises(jaxjob.CheckpointSaveError, match="epoch 0 .*injected I/O error"):
        ckpt.wait_until_finished()
    assert orbax_commit._checksums_at_commit == {}
    ckpt.save(0, {"w": jnp.arange(1000.0) + 1})
    ckpt.wait_until_finished()
    assert orbax_commit._checksums_at_commit == {}
    assert ckpt.committed_epochs() == [0] and ckpt.verify(0) == []
    assert float(jaxjob.restore(str(tmp_path), epoch=0)["w"][0]) == 1.0
    ckpt.close()


def test_verify_reads_the_leaves_in_batches(tmp_path, monkeypatch):
    """verify reads 200 leaves in one Orbax restore per item (not one each: Orbax parses the
    item's metadata at every restore, so a 3000-leaf resume decision took minutes); leaves past
    the batch budget start a new batch. (A damaged leaf of a batch is named: the tests above, whose
    five leaves are read as one batch.)"""
    from jaxjob._src.checkpoint import leaf_check
    from jaxjob._src.checkpoint.io import CheckpointIO

    restores = []
    restore = CheckpointIO.restore

    def counted(self, path, item, tree, *args, **kwargs):
        restores.append(len(tree))
        return restore(self, path, item, tree, *args, **kwargs)

    monkeypatch.setattr(CheckpointIO, "restore", counted)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {f"p{i:03d}": jnp.full((256,), i, jnp.float32) for i in range(200)})
    ckpt.close()
    path = ckpt.get_ckpt_db_name("local", 0)
    assert verify.verify(path) == []
    assert restores == [200]  # the state item's leaves at once; no outputs
    restores.clear()
    monkeypatch.setattr(leaf_check, "BATCH_BYTES", 64 * 1024)  # 64 leaves of 1 KiB a batch
    assert verify.verify(path) == []
    assert restores == [64, 64, 64, 8]
