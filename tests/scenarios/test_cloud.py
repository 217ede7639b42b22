"""Object stores: whole jobs on gs:// and s3:// against real local servers."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob

pytestmark = pytest.mark.timeout(180)


def _job(epochs, calls):
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        key = jax.random.key(0)
        return {
            "params": {
                "w": jax.random.normal(key, (4, 3)),
                "layers": {i: jnp.ones(2) for i in range(11)},
            },
            "rng": jax.random.key(1),
        }

    @job.init_group.task(jit=False)
    def host_init(ws):
        return {"cursor": np.array([0, 0], np.int64), "seen": 0}

    @job.epoch_group.task
    def step(ws):
        rng, key = jax.random.split(ws["rng"])
        w = ws["params"]["w"] - 0.1 * jax.random.normal(key, (4, 3))
        layers = {i: v * 1.5 for i, v in ws["params"]["layers"].items()}
        return {"params": {"w": w, "layers": layers}, "rng": rng, "loss": jnp.sum(w**2)}

    @job.epoch_group.task(jit=False)
    def host_step(ws):
        calls.append(1)
        return {"cursor": ws["cursor"] + 3, "seen": ws["seen"] + 1}

    jaxjob.epoch_limiter(job, epochs)
    return job


def _train(prefix, epochs, calls=None):
    calls = [] if calls is None else calls
    session = jaxjob.Session()
    manager = jaxjob.CheckpointManager(prefix)
    last = jaxjob.JobRunner(_job(epochs, calls), manager, on_save_error="raise").train(session)
    manager.close()
    return last, session.workspace, calls


def _digest(ws):
    def bytes_of(x):
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return (type(x).__name__, str(np.asarray(x).dtype), np.asarray(x).tobytes())

    return [bytes_of(x) for x in jax.tree.leaves(dict(ws))], jax.tree.structure(dict(ws))


@pytest.fixture(params=["gcs", "s3"])
def bucket_prefix(request):
    return request.getfixturevalue(f"{request.param}_prefix")


def test_job_on_a_bucket_ends_bitwise_equal_to_local_disk(bucket_prefix, tmp_path, monkeypatch):
    """Train 2 epochs, extend to 4 (resume), re-run (nothing runs): bitwise equal to local disk."""
    _, local, _ = _train(str(tmp_path / "local"), 4)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert _train(bucket_prefix, 2)[0] == 2
    last, remote, calls = _train(bucket_prefix, 4)
    assert last == 4 and len(calls) == 2  # epochs 3 and 4 ran after resuming from 2
    assert _digest(remote) == _digest(local)
    last, _, calls = _train(bucket_prefix, 4)
    assert last == 4 and calls == []  # finished: nothing runs
    assert jaxjob.CheckpointManager(bucket_prefix).committed_epochs() == [0, 1, 2, 3, 4]
    params = jaxjob.restore(bucket_prefix, leaves=["params"])
    assert sorted(params) == ["params"]
    np.testing.assert_array_equal(params["params"]["w"], local["params"]["w"])
    assert list(params["params"]["layers"]) == list(range(11))
    early = jaxjob.restore(f"{bucket_prefix}/local.1", leaves=["cursor"])
    assert early["cursor"].tolist() == [3, 3]
    assert os.listdir(cwd) == []  # nothing was written to local disk


def test_bucket_checkpoint_without_commit_marker_is_never_listed_or_loaded(bucket_prefix):
    """Deleting commit_success.txt from an epoch hides it from listing, resume and restore."""
    from etils import epath

    _train(bucket_prefix, 2)
    (epath.Path(bucket_prefix) / "local.2" / "commit_success.txt").unlink()
    manager = jaxjob.CheckpointManager(bucket_prefix)
    assert manager.committed_epochs() == [0, 1]
    assert jaxjob.restore(bucket_prefix, leaves=["seen"])["seen"] == 1
    with pytest.raises(FileNotFoundError, match="not a committed checkpoint"):
        jaxjob.restore(f"{bucket_prefix}/local.2")
    last, _, calls = _train(bucket_prefix, 2)
    assert last == 2 and len(calls) == 1  # resumed from 1, ran epoch 2 again


def test_cli_lists_a_bucket(bucket_prefix, capsys):
    """`jaxjob ls gs://...` / `s3://...` prints one row per checkpoint; a bad one, one line."""
    from jaxjob import cli

    _train(bucket_prefix, 1)
    capsys.readouterr()
    assert cli.main(["ls", bucket_prefix]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["node", "epoch", "committed", "size", "save", "age"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["local", "0", "yes"],
        ["local", "1", "yes"],
    ]
    assert cli.main(["ls", bucket_prefix + "-missing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxjob ls: no checkpoint directories under")


def test_a_listing_leaves_no_cache_that_hides_a_deletion(s3_prefix):
    """After list_files, a marker deleted by another client is gone for exists() too."""
    import boto3

    from jaxjob._src.base import fs

    ckpt = jaxjob.CheckpointManager(s3_prefix)
    ckpt.save(0, {"w": jnp.ones(4)})
    ckpt.close()
    path = fs.join(s3_prefix, "local.0")
    assert "commit_success.txt" in fs.list_files(path)
    bucket, key = path.removeprefix("s3://").split("/", 1)
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"{key}/commit_success.txt")
    assert not fs.exists(fs.join(path, "commit_success.txt"))
