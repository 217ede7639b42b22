"""The seed's checkpoint_test.py, ported: the same pipelines, values and epochs."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seed_pipeline import EXPECTED_TOTALS, build_pipeline

import jaxjob

MANAGERS = {
    "single": lambda d: jaxjob.CheckpointManager(d, "temp_node"),
    "multi": lambda d: jaxjob.MultiNodeCheckpointManager(d),
}


def _job(node_id=0):
    with jaxjob.Job() as job:
        total = build_pipeline(node_id)
    return job, total


@pytest.mark.parametrize("kind", sorted(MANAGERS))
def test_train_resume_and_load(tmp_path, kind):
    """A fresh run returns 4 with total 145; resumes from 1..4 end at 145; loads give each epoch."""
    job, total = _job()

    def builder():
        return jaxjob.Session(), MANAGERS[kind](str(tmp_path))

    session, ckpt = builder()
    assert jaxjob.JobRunner(job, ckpt).train(session) == 4
    assert session.workspace[total].tolist() == [145]

    returned = []
    for initial_epoch in range(1, 5):
        session, ckpt = builder()
        returned.append(jaxjob.JobRunner(job, ckpt, resume_from_epoch=initial_epoch).train(session))
        assert session.workspace[total].tolist() == [145]
    assert returned == [4, 4, 4, 5]

    for epoch in range(1, 5):
        assert ckpt.load(epoch)[total].tolist() == [EXPECTED_TOTALS[epoch - 1]]


def test_resume_does_not_run_init(tmp_path):
    """Resuming runs no init task: host tasks are not called, jitted ones only traced."""
    ran = []
    with jaxjob.Job() as job:
        total = build_pipeline(0)
        with jaxjob.Node("trainer_0"), job.init_group:

            def host_init(ws):
                ran.append("host")
                return {"host_cursor": np.int64(7)}

            def jitted_init(ws):
                jax.debug.callback(lambda: ran.append("jitted"))
                return {"scale": jnp.float32(2.0)}

            jaxjob.Task(host_init, jit=False)
            jaxjob.Task(jitted_init)
    jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(jaxjob.Session())
    assert ran == ["host", "jitted"]
    session = jaxjob.Session()
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    jaxjob.JobRunner(job, ckpt, resume_from_epoch=2).train(session)
    assert ran == ["host", "jitted"]
    assert session.workspace[total].tolist() == [145]
    assert session.workspace["host_cursor"] == 7
    assert type(session.workspace["host_cursor"]) is np.int64


def test_ckpt_db_names(tmp_path):
    """Each node's checkpoint of epoch 5 is <db_prefix>/<node>.5."""
    with jaxjob.Job() as job:
        for node_id in range(3):
            build_pipeline(node_id)
    ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path))
    ckpt.init(job.nodes_to_checkpoint())
    assert job.nodes_to_checkpoint() == ["trainer_0", "trainer_1", "trainer_2"]
    for node_id in range(3):
        name = f"trainer_{node_id}"
        assert ckpt.get_ckpt_db_name(name, 5) == f"{tmp_path}/{name}.5"
    assert jaxjob.db_name(5, "trainer_0", str(tmp_path)) == f"{tmp_path}/trainer_0.5"
    assert jaxjob.db_name(5, "n", "/x", path_prefix="/y/p_") == "/y/p_n.5"


def test_load_model_from_checkpoints_of_separately_trained_nodes(tmp_path):
    """Three nodes trained separately into one directory; two nodes' totals load for 1..4, not 5."""
    for node_id in range(3):
        job, _ = _job(node_id)
        session = jaxjob.Session()
        ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path))
        assert jaxjob.JobRunner(job, ckpt).train(session) == 4
        assert len(session.workspace) == 3  # only the init group's leaves persist

    with jaxjob.Job() as job:
        for node_id in range(3):
            build_pipeline(node_id)
    names = ["trainer_1/total", "trainer_2/total"]
    session = jaxjob.Session()
    assert len(session.workspace) == 0
    runner = jaxjob.JobRunner(job, jaxjob.MultiNodeCheckpointManager(str(tmp_path)))
    for epoch in range(1, 5):
        assert runner.load_blobs_from_checkpoints(names, epoch, session)
        assert sorted(session.workspace) == names
        for name in names:
            assert session.workspace[name].tolist() == [EXPECTED_TOTALS[epoch - 1]]
    assert not runner.load_blobs_from_checkpoints(names, 5, session)


class UploadToLocalDir(jaxjob.UploadTaskGroupBuilder):
    """Copies the last epoch's checkpoint of each node to <dest_dir>/<node>."""

    def __init__(self, dest_dir):
        self.dest_dir = dest_dir

    def build(self, epoch, checkpoint_manager):
        group = jaxjob.TaskGroup(jit=False)
        for node, manager in checkpoint_manager.node_managers:
            src = manager.get_ckpt_db_name(node, epoch)
            dest = os.path.join(self.dest_dir, node)

            def copy(ws, src=src, dest=dest):
                shutil.copytree(src, dest)

            group.add(copy)
        return group


def test_upload_checkpoint(tmp_path):
    """The upload builder copies each node's committed last checkpoint; the copy restores."""
    upload_dir = tmp_path / "upload"
    upload_dir.mkdir()
    for node_id in range(3):
        assert not (upload_dir / f"trainer_{node_id}").exists()
        job, _ = _job(node_id)
        ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path / "ckpt"))
        runner = jaxjob.JobRunner(job, ckpt, upload_task_group_builder=UploadToLocalDir(upload_dir))
        assert runner.train(jaxjob.Session()) == 4
    for node_id in range(3):
        copy = upload_dir / f"trainer_{node_id}"
        assert copy.exists()
        restored = jaxjob.restore(str(copy), leaves=[f"trainer_{node_id}/total"])
        assert restored[f"trainer_{node_id}/total"].tolist() == [145]


def test_save_failure_does_not_fail_the_job(tmp_path):
    """Every save failing (prefix under a regular file) still trains 4 epochs; failures recorded."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for node_id in range(3):
        job, total = _job(node_id)
        session = jaxjob.Session()
        handler = jaxjob.DiskMetadataHandler()
        ckpt = jaxjob.MultiNodeCheckpointManager(str(blocker / "ckpt"), metadata_handler=handler)
        runner = jaxjob.JobRunner(job, ckpt)
        assert runner.train(session) == 4
        assert session.workspace[total].tolist() == [145]
        assert [e.epoch for e in runner.save_errors] == [0, 1, 2, 3, 4]
        failed = [h for h in handler.history if h["action"] == "checkpoint_save"]
        assert len(failed) == 5
        assert all(v["error"] for h in failed for v in h["stats"].values())


def test_download_group_runs_after_the_epochs():
    """The download group sees the trained values (epoch_limiter(1): all 2.0)."""
    with jaxjob.Job() as job, jaxjob.Node("trainer:0"):

        @job.init_group.task
        def init(ws):
            ones = jnp.ones(8, jnp.float32)
            return {n: ones for n in ["input1", "input2", "output", "download_result"]}

        @job.epoch_group.task
        def add(ws):
            return {"output": ws["input1"] + ws["input2"]}

        @job.download_group.task
        def download(ws):
            return {"download_result": ws["output"]}

        jaxjob.epoch_limiter(job, 1)

    session = jaxjob.Session()
    assert jaxjob.JobRunner(job).train(session) == 1
    expected = np.full(8, 2.0, np.float32)
    np.testing.assert_array_equal(session.workspace["output"], expected)
    np.testing.assert_array_equal(session.workspace["download_result"], expected)


def test_reuse_session_and_checkpoint_manager(tmp_path):
    """One session and one manager serve a run and four resumes."""
    job, total = _job()
    session = jaxjob.Session()
    ckpt = jaxjob.MultiNodeCheckpointManager(str(tmp_path))
    num_epochs = jaxjob.JobRunner(job, ckpt).train(session)
    assert num_epochs == 4
    for initial_epoch in range(1, num_epochs + 1):
        jaxjob.JobRunner(job, ckpt, resume_from_epoch=initial_epoch).train(session)
        assert session.workspace[total].tolist() == [145]
