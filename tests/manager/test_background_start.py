"""Small saves start on a worker thread: the training thread copies the leaves and returns."""

import errno
import logging
import os
import threading

import disks
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob
from jaxjob._src.manager.save import background_start


def _save_threads(caplog):
    """The thread that started each save, by epoch (from the writer's debug line)."""
    found = {}
    for record in caplog.records:
        if record.getMessage().startswith("Saving epoch "):
            found[int(record.getMessage().split()[2])] = record.threadName
    return found


def test_a_small_save_starts_on_the_worker_thread_a_large_one_on_the_callers(
    tmp_path, caplog, monkeypatch
):
    """At most SMALL_SAVE_BYTES: Orbax's start runs on the worker thread; above: on the caller's.
    Both write the same checkpoints."""
    caplog.set_level(logging.DEBUG, logger="jaxjob")
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"x": jnp.arange(4.0)})
    monkeypatch.setattr(background_start, "SMALL_SAVE_BYTES", 8)  # 16 bytes is now large
    ckpt.save(1, {"x": jnp.arange(4.0) + 1})
    ckpt.close()
    threads = _save_threads(caplog)
    assert threads[0].startswith("jaxjob-save-start")
    assert threads[1] == threading.current_thread().name
    for epoch in (0, 1):
        assert jaxjob.restore(str(tmp_path), epoch=epoch)["x"].tolist() == [
            float(i + epoch) for i in range(4)
        ]


def test_a_step_donating_every_leaf_right_after_a_small_save_leaves_its_checkpoint_exact(
    tmp_path,
):
    """The training thread copies the leaves before save() returns: a jitted step that donates
    them at once gets them (on the CPU the donated arrays are deleted), and every checkpoint
    holds the values saved, though Orbax had not started when the step ran."""
    step = jax.jit(lambda ws: jax.tree.map(lambda a: a + 1, ws), donate_argnums=0)
    ws = {"w": jnp.zeros((64, 64)), "b": jnp.zeros(64, jnp.int32)}
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in range(5):
        ckpt.save(epoch, ws)
        saved, ws = ws, step(ws)
        if jax.default_backend() == "cpu":
            assert all(a.is_deleted() for a in saved.values())  # donated: nothing held them
    ckpt.close()
    assert ckpt.tier("persistent").failures == []
    for epoch in range(5):
        restored = jaxjob.restore(str(tmp_path), epoch=epoch)
        assert np.all(np.asarray(restored["w"]) == epoch)
        assert np.all(np.asarray(restored["b"]) == epoch)


def test_a_failed_start_on_the_worker_thread_is_reported_and_keeps_what_was_committed(tmp_path):
    """A disk out of inodes: the worker's start cannot create the save's directory. save()
    returns (the start is the worker's), wait_until_finished raises the failure naming the
    epoch and the error, it is counted, epoch 0 stays committed and exact, and once inodes are
    free again the next save commits."""
    disk = tmp_path / "disk"
    disks.mount_tmpfs(disk, "8m", nr_inodes=64)
    try:
        ckpt = jaxjob.CheckpointManager(str(disk / "ckpt"))
        ckpt.save(0, {"x": jnp.arange(3.0)})
        ckpt.wait_until_finished()
        fillers = []
        while True:
            try:
                fillers.append(os.open(disk / f"f{len(fillers)}", os.O_CREAT | os.O_WRONLY))
            except OSError as err:
                assert err.errno == errno.ENOSPC
                break
        ckpt.save(1, {"x": jnp.arange(3.0) + 1})  # returns: the worker thread starts it
        with pytest.raises(jaxjob.CheckpointSaveError, match=r"epoch 1.*No space left"):
            ckpt.wait_until_finished()
        assert len(ckpt.tier("persistent").failures) == 1
        assert ckpt.committed_epochs() == [0]
        assert ckpt.load(0)["x"].tolist() == [0.0, 1.0, 2.0]
        for i, fd in enumerate(fillers):
            os.close(fd)
            os.remove(disk / f"f{i}")
        ckpt.save(2, {"x": jnp.arange(3.0) + 2})
        ckpt.close()
        assert ckpt.committed_epochs() == [0, 2]
    finally:
        disks.unmount(disk)


def test_a_forked_child_makes_its_own_worker_thread(tmp_path):
    """The worker thread is not copied by fork: a child that saved through the parent's would
    wait forever, so the child forgets it (and its lock) and makes its own on first use."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"x": jnp.arange(3.0)})  # the parent's worker thread exists now
    ckpt.wait_until_finished()
    assert background_start._executor is not None
    pid = os.fork()
    if pid == 0:  # the child: no JAX here, only the module's state
        fresh = background_start._executor is None and not background_start._LOCK.locked()
        os._exit(0 if fresh else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ckpt.close()
