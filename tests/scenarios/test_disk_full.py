"""Failed and killed saves: a full disk for real (a small tmpfs), and the temporaries left."""

import glob
import json
import os
import subprocess
import sys

import disks
import numpy as np
import paths
import pytest
from long_job import reference

import jaxjob
from jaxjob._src.base import faults

SCRIPT = os.path.join(paths.JOBS, "long_job.py")
SIZE = 262144  # float32 leaves: each checkpoint is about 1 MiB


def _run(ckpt, out, *extra, env=None):
    proc = subprocess.run(
        [sys.executable, SCRIPT, str(ckpt), str(out), "--size", str(SIZE), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    errors = [line for line in proc.stdout.splitlines() if line.startswith("SAVE_ERRORS ")]
    return proc, json.loads(errors[-1].split(" ", 1)[1]) if errors else None


def _same_workspace(a, b):
    with np.load(a) as x, np.load(b) as y:
        assert list(x["kinds"]) == list(y["kinds"])
        for name in x.files:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs with room for three checkpoints, unmounted at teardown."""
    disk = tmp_path / "disk"
    disks.mount_tmpfs(disk, "3400k")
    yield disk
    disks.unmount(disk)


def _listing(path, history=True):
    """What ``path`` holds but the metadata, the history (a runner's) and the run id (no lock)."""
    kept = ["history", "run.json"] if history else ["run.json"]
    assert sorted(os.listdir(os.path.join(path, ".jaxjob"))) == kept
    records = ("jaxjob_metadata.jsonl", ".jaxjob")
    return sorted(n for n in os.listdir(path) if n not in records)


def test_disk_full_keeps_older_epochs_and_a_later_run_resumes(small_disk, tmp_path):
    """ENOSPC: warn goes on reporting each epoch, raise raises, nothing partial; then it resumes."""
    ckpt = small_disk / "run"
    proc, errors = _run(ckpt, os.devnull)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert errors == [3, 4, 5, 6, 7, 8]  # every failed epoch reported, training went on
    assert "Unable to write checkpoint for epoch 3" in proc.stderr
    assert "No space left on device" in proc.stderr
    assert _listing(ckpt) == ["local.0", "local.1", "local.2"]  # no temporaries
    for epoch in (0, 1, 2):
        assert jaxjob.restore(str(ckpt), epoch=epoch, leaves=["w"])["w"].shape == (SIZE,)

    proc, errors = _run(ckpt, os.devnull, "--on-save-error", "raise")
    assert proc.returncode == 1
    assert "CheckpointSaveError: saving checkpoint epoch 3" in proc.stderr
    assert "No space left on device" in proc.stderr
    assert _listing(ckpt) == ["local.0", "local.1", "local.2"]

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    proc, errors = _run(ckpt, tmp_path / "out.npz")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert errors == [] and "Resuming from epoch 2" in proc.stderr
    reference(tmp_path / "ref.npz", size=SIZE)
    _same_workspace(tmp_path / "ref.npz", tmp_path / "out.npz")


def test_temporaries_of_a_killed_save_are_removed_by_the_next_writer(tmp_path):
    """Killed before its commit, a save leaves a temporary; the next run removes it, quietly."""
    proc, _ = _run(tmp_path / "ckpt", os.devnull, env={faults.KILL_AT_ENV: "save.commit:3"})
    assert proc.returncode == -9, proc.stderr[-3000:]
    (tmp,) = glob.glob(str(tmp_path / "ckpt" / "local.2.orbax-checkpoint-tmp*"))
    proc, errors = _run(tmp_path / "ckpt", tmp_path / "out.npz")
    assert proc.returncode == 0 and errors == [], proc.stderr[-3000:]
    assert "Attempted to create temporary directory" not in proc.stderr  # Orbax's absl warning
    removed = [line for line in proc.stderr.splitlines() if "Removed leftovers" in line]
    assert len(removed) == 1 and os.path.basename(tmp) in removed[0]
    assert _listing(tmp_path / "ckpt") == [f"local.{e}" for e in range(9)]
    reference(tmp_path / "ref.npz", size=SIZE)
    _same_workspace(tmp_path / "ref.npz", tmp_path / "out.npz")


def test_what_a_failed_save_left_after_its_removal_goes_at_the_next_save_and_at_close(
    tmp_path, monkeypatch
):
    """A temporary made after a failed save was cleaned up is removed again later.

    A save fails as soon as one of its writes does, while Orbax's and TensorStore's
    threads may still create its directories (a full tmpfs once left
    ``local.6.orbax-checkpoint-tmp`` so): the writer removes a failed save's
    temporaries again before its next save and when it closes. The late directory is
    made by hand here, where such a thread would make it.
    """
    import jax.numpy as jnp

    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.commit:2")  # the save of epoch 1 fails
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.arange(8.0)})
    ckpt.save(1, {"w": jnp.arange(8.0) + 1})
    with pytest.raises(jaxjob.CheckpointSaveError, match="epoch 1 .*injected I/O error"):
        ckpt.wait_until_finished()
    late = tmp_path / "local.1.orbax-checkpoint-tmp-1" / "state" / "d"
    late.mkdir(parents=True)
    ckpt.save(2, {"w": jnp.arange(8.0) + 2})
    ckpt.wait_until_finished()
    assert not late.parent.parent.exists()

    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.commit:4")  # and the save of epoch 3
    ckpt.save(3, {"w": jnp.arange(8.0) + 3})
    with pytest.raises(jaxjob.CheckpointSaveError, match="epoch 3 .*injected I/O error"):
        ckpt.wait_until_finished()
    late = tmp_path / "local.3.orbax-checkpoint-tmp-7"
    late.mkdir()
    ckpt.close()
    assert not late.exists()
    assert _listing(tmp_path, history=False) == ["local.0", "local.2"]
    assert ckpt.committed_epochs() == [0, 2]


def test_a_save_failing_as_it_starts_makes_no_directory_after_its_removal(tmp_path, monkeypatch):
    """A save that fails inside Orbax's start (its ``save.copy`` fail point, a 20 MiB save that
    starts on the training thread) while its temporary directory is still being made: the
    directory is made before the failure is raised and removed with it, so nothing appears
    later. Made in a thread of Orbax's own, it appeared after ``close()`` (``local.7.orbax-
    checkpoint-tmp`` on a full tmpfs under load); the making is slowed here to show it."""
    import time

    import jax.numpy as jnp

    from jaxjob._src.internals import orbax_commit
    from jaxjob._src.manager.save import background_start

    create = orbax_commit.DurableRename.create

    async def slow_create(self):
        time.sleep(0.5)  # a busy machine: the directory is made late
        return await create(self)

    monkeypatch.setattr(orbax_commit.DurableRename, "create", slow_create)
    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.copy:2")  # the save of epoch 1 fails
    monkeypatch.setattr(background_start, "SMALL_SAVE_BYTES", 16 << 20)  # started here, below
    ws = {"w": jnp.zeros(5 << 20, jnp.float32)}  # 20 MiB: over the small saves' 16 MiB
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, ws)
    with pytest.raises(jaxjob.CheckpointSaveError, match="epoch 1 .*injected I/O error"):
        ckpt.save(1, ws)
    ckpt.close()
    time.sleep(1.5)  # a thread still making the directory would have made it by now
    assert _listing(tmp_path, history=False) == ["local.0"]
    assert ckpt.committed_epochs() == [0]


def test_a_failed_write_surfaces_once_the_saves_other_writes_are_done(tmp_path, monkeypatch):
    """An injected write failure while a 32 MiB leaf is still being written: the failure
    surfaces only once every write of that save is done, so the removal of its temporary
    directory is final: nothing of it is left, neither then nor once ``close()`` returns
    (the write went on after the failure and made the directory again)."""
    import jax.numpy as jnp

    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.write:2")  # the save of epoch 1 fails
    rng = np.random.default_rng(0)
    ws = {"big": jnp.asarray(rng.random(8 << 20, dtype=np.float32))}
    ws |= {f"small{i}": jnp.asarray(rng.random(1 << 16, dtype=np.float32)) for i in range(16)}
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, ws)
    ckpt.save(1, ws)
    with pytest.raises(jaxjob.CheckpointSaveError, match="epoch 1 .*injected I/O error"):
        ckpt.wait_until_finished()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("local.")) == ["local.0"]
    ckpt.close()
    assert _listing(tmp_path, history=False) == ["local.0"]
