"""Retention: keep policies, what they delete, and deletion that survives kills and failures."""

import glob
import os
import subprocess
import sys

import disks
import jax.numpy as jnp
import numpy as np
import paths
import pytest
from long_job import build_job, reference

import jaxjob
from jaxjob import keep
from jaxjob._src.base import faults
from jaxjob._src.checkpoint import manifest

SCRIPT = os.path.join(paths.JOBS, "long_job.py")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: keep.Last(0), r"Last: n must be a positive int, got 0"),
        (lambda: keep.Every(True), r"Every: k must be a positive int, got True"),
        (lambda: keep.Best(""), r"Best: name must be a non-empty str, got ''"),
        (lambda: keep.Best("acc", n=0), r"Best: n must be a positive int, got 0"),
        (lambda: keep.Best("acc", mode="avg"), r"Best: mode must be 'max' or 'min', got 'avg'"),
        (lambda: keep.normalize([]), r"keep must be None, a policy of jaxjob.keep .* got \[\]"),
        (lambda: jaxjob.CheckpointManager("/tmp/x", keep=3), r"keep must be None.* got 3"),
    ],
)
def test_bad_policies_are_rejected_naming_the_argument(make, message):
    """A policy with a bad argument raises ValueError naming it and what was received."""
    with pytest.raises(ValueError, match=message):
        make()


SCORES = {e: {"score": -((e - 4.0) ** 2)} for e in range(1, 9)}  # epoch 0 has no score


@pytest.mark.parametrize(
    "policy, expected",
    [
        (keep.Last(2), {7, 8}),
        ([keep.Last(1), keep.Every(3)], {0, 3, 6, 8}),
        ([keep.Last(1), keep.Best("score", 1)], {4, 8}),
        (keep.Best("score", 2, mode="min"), {7, 8}),  # 1 and 7 tie: the newer wins
        (keep.Best("score", 3), {3, 4, 5, 8}),  # ties (3 and 5) both fit; the newest is kept
        (None, set(range(9))),
    ],
)
def test_kept_is_the_union_of_the_policies_plus_the_newest(policy, expected):
    """kept() gives the issue's examples: the policies' union, and always the newest epoch."""
    assert keep.kept(policy, range(9), SCORES) == expected


@pytest.mark.parametrize(
    "policy, expected",
    [
        (keep.Last(2), [7, 8]),
        ([keep.Last(1), keep.Every(3)], [0, 3, 6, 8]),
        ([keep.Last(1), keep.Best("score", 1)], [4, 8]),
    ],
)
def test_training_eight_epochs_leaves_what_the_policy_keeps(tmp_path, policy, expected):
    """After 8 epochs under keep=..., only the kept epochs are on disk, nothing else."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path), keep=policy)
    jaxjob.JobRunner(build_job(8, 16, 0.0), ckpt).train(jaxjob.Session())
    ckpt.close()
    assert ckpt.committed_epochs() == expected
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"local.{e}" for e in expected] + ["jaxjob_metadata.jsonl", ".jaxjob"]
    )
    # the run id and the history; the lock is gone
    assert sorted(os.listdir(tmp_path / ".jaxjob")) == ["history", "run.json"]


def test_best_ranking_survives_a_restart(tmp_path):
    """The score is stored in each manifest: a new manager after a restart still keeps the best."""
    policy = [keep.Last(1), keep.Best("score")]
    first = jaxjob.CheckpointManager(str(tmp_path), keep=policy)
    assert first.tier("persistent").required_outputs == ("score",)
    jaxjob.JobRunner(build_job(5, 16, 0.0), first).train(jaxjob.Session())
    first.close()
    assert first.committed_epochs() == [4, 5]
    second = jaxjob.CheckpointManager(str(tmp_path), keep=policy)
    jaxjob.JobRunner(build_job(8, 16, 0.0), second).train(jaxjob.Session())
    second.close()
    assert second.committed_epochs() == [4, 8]
    assert manifest.read(str(tmp_path / "local.4")).metrics == {"score": 0.0}
    assert manifest.read(str(tmp_path / "local.8")).metrics == {"score": -16.0}


def test_a_nan_metric_is_not_ranked_and_its_checkpoint_reads(tmp_path):
    """An epoch whose Best metric is NaN (a diverged run) is saved without it: not ranked, and
    its checkpoint restores (a NaN in the manifest was refused as corrupt on read)."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path), keep=[keep.Last(1), keep.Best("v")])
    for epoch, v in enumerate([0.5, float("nan"), 0.9, float("nan")]):
        ckpt.save(epoch, {"w": jnp.full(3, float(epoch))}, outputs={"v": jnp.float32(v)})
    ckpt.close()
    assert ckpt.committed_epochs() == [2, 3]  # the newest, and the best finite one (0.9)
    assert manifest.read(str(tmp_path / "local.3")).metrics == {}
    np.testing.assert_array_equal(jaxjob.restore(str(tmp_path))["w"], np.full(3, 3.0))


def test_best_of_a_non_scalar_fails_the_save_naming_it(tmp_path):
    """keep=Best(name) on a non-scalar leaf fails that save with a message naming the leaf."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path), keep=keep.Best("w"), async_save=False)
    with pytest.raises(
        ValueError, match=r"keep=Best\('w'\) ranks by a numeric scalar.*shape \(3,\)"
    ):
        ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(3)}))
    ckpt.close()


def test_multi_node_epochs_are_deleted_for_every_node_together(tmp_path):
    """With several nodes, keep=Last(1) deletes each old epoch of every node."""
    ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path), keep=keep.Last(1))
    ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
    for epoch in range(4):
        ckpt.save(epoch, jaxjob.Workspace({"x": jnp.full(2, epoch), "y": jnp.ones(2)}))
    ckpt.close()
    assert sorted(n for n in os.listdir(tmp_path) if n[0] in "ab") == [
        "a.3", "b.3",
    ]  # fmt: skip


def test_a_failed_deletion_is_logged_and_retried_after_the_next_commit(tmp_path, caplog):
    """A deletion failing for real (a busy mount point inside) is logged, not fatal, retried."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path), keep=keep.Last(1), async_save=False)
    ckpt.save(0, jaxjob.Workspace({"w": jnp.zeros(2)}))
    disks.mount_tmpfs(tmp_path / "local.0" / "busy", "1m")
    try:
        ckpt.save(1, jaxjob.Workspace({"w": jnp.ones(2)}))
        assert "Could not delete" in caplog.text and "Device or resource busy" in caplog.text
        assert ckpt.committed_epochs() == [1]  # the half-deleted epoch is not committed
        (aside,) = glob.glob(str(tmp_path / "local.0.deleting-*"))
    finally:
        busy = glob.glob(str(tmp_path / "local.0*" / "busy"))
        subprocess.run(["umount", *busy], check=True)
    ckpt.save(2, jaxjob.Workspace({"w": jnp.full(2, 2.0)}))
    ckpt.close()
    assert not os.path.exists(aside)
    assert sorted(os.listdir(tmp_path)) == [".jaxjob", "local.2"]
    assert os.listdir(tmp_path / ".jaxjob") == ["run.json"]
    np.testing.assert_array_equal(ckpt.load(2)["w"], [2.0, 2.0])


def _run(ckpt, out, *extra, env=None):
    return subprocess.run(
        [sys.executable, SCRIPT, str(ckpt), str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def _same_workspace(a, b):
    with np.load(a) as x, np.load(b) as y:
        assert list(x["kinds"]) == list(y["kinds"])
        for name in x.files:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def test_killed_during_deletion_resumes_exactly_and_finishes_retention(tmp_path):
    """Killed between un-committing and removing an epoch: the restart is exact and cleans up."""
    reference(tmp_path / "ref.npz")
    env = {faults.KILL_AT_ENV: "retention.delete:2"}
    dead = _run(tmp_path / "ckpt", tmp_path / "dead.npz", "--keep", "keep.Last(2)", env=env)
    assert dead.returncode == -9, dead.stderr[-2000:]
    ckpt = jaxjob.CheckpointManager(str(tmp_path / "ckpt"))
    assert ckpt.committed_epochs() == [2, 3]  # epoch 1 was being deleted: not committed
    assert glob.glob(str(tmp_path / "ckpt" / "local.1.deleting-*"))
    proc = _run(tmp_path / "ckpt", tmp_path / "out.npz", "--keep", "keep.Last(2)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "finished at epoch 8" in proc.stdout
    assert "Removed leftovers of killed saves" in proc.stderr and "local.1.deleting-" in proc.stderr
    assert "Attempted to create temporary directory" not in proc.stderr
    assert ckpt.committed_epochs() == [7, 8]
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        ".jaxjob", "jaxjob_metadata.jsonl", "local.7", "local.8",
    ]  # fmt: skip
    assert sorted(os.listdir(tmp_path / "ckpt" / ".jaxjob")) == ["history", "run.json"]
    _same_workspace(tmp_path / "ref.npz", tmp_path / "out.npz")
