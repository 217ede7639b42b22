"""Saves that cannot succeed are refused up front; a failing save is reported in one line."""

import logging
import os
import re

import disks
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxjob

# Leaves Orbax 0.12 cannot write: TensorStore has no uint2/uint4/float8_e4m3; zero-size arrays.
UNSTORABLE = [
    (
        "uint4",
        lambda: jnp.arange(4, dtype=jnp.uint4),
        r"dtype uint4, shape \(4,\)\): .*dtype uint4",
    ),
    (
        "uint2",
        lambda: jnp.arange(4, dtype=jnp.uint2),
        r"dtype uint2, shape \(4,\)\): .*dtype uint2",
    ),
    (
        "float8_e4m3",
        lambda: jnp.ones((2, 2), jnp.float8_e4m3),
        r"dtype float8_e4m3, shape \(2, 2\)\): .*cannot store dtype float8_e4m3",
    ),
    ("zero-size", lambda: jnp.zeros((0, 3)), r"dtype float32, shape \(0, 3\)\): .*zero-size"),
    (
        "zero-size key",
        lambda: jax.random.split(jax.random.key(0), 0),
        r"dtype key<fry>, shape \(0,\)\): .*zero-size",
    ),
]
# Those TensorStore has, and so Orbax stores (every other low-precision dtype JAX supports).
STORABLE = [
    "int4",
    "int2",
    "float8_e5m2",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2fnuz",
    "float8_e3m4",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "bfloat16",
]


def _epoch_dirs(path):
    """Epoch directories and their temporaries or superseded copies (not the lock)."""
    return sorted(n for n in os.listdir(path) if re.match(r"local\.\d", n))


def _bad_tree(make):
    leaf = make()
    return {"k": leaf} if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) else {"w": leaf}


def _job(bad):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(()), "bad": bad})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    jaxjob.epoch_limiter(job, 2)
    return job


@pytest.mark.parametrize("policy", ["warn", "raise"])
@pytest.mark.parametrize(("case", "make", "message"), UNSTORABLE, ids=[c[0] for c in UNSTORABLE])
def test_unstorable_leaf_raises_at_the_first_save_whatever_the_policy(
    tmp_path, policy, case, make, message
):
    """train raises a TypeError naming the key path, dtype and shape at epoch 0's save;
    nothing is written and no epoch runs."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    runner = jaxjob.JobRunner(_job(_bad_tree(make)), ckpt, on_save_error=policy)
    where = r"cannot checkpoint the (jax\.Array|PRNG key array) at \['bad'\]\['[wk]'\] \("
    with pytest.raises(TypeError, match=where + message):
        runner.train(jaxjob.Session())
    assert runner.history == [] and ckpt.committed_epochs() == []
    assert _epoch_dirs(tmp_path) == []


@pytest.mark.parametrize(("case", "make", "message"), UNSTORABLE, ids=[c[0] for c in UNSTORABLE])
@pytest.mark.parametrize("epoch", [1, 0], ids=["next epoch", "same epoch again"])
def test_refused_save_loses_nothing_committed(tmp_path, case, make, message, epoch):
    """After a committed epoch 0, saving an unstorable leaf (as epoch 1, or epoch 0 again)
    raises before writing; epoch 0 is still listed and restores."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.arange(3.0)})
    ckpt.wait_until_finished()
    with pytest.raises(TypeError, match=message):
        ckpt.save(epoch, {"w": jnp.arange(3.0), "bad": _bad_tree(make)})
    ckpt.wait_until_finished()
    assert ckpt.committed_epochs() == [0]
    assert _epoch_dirs(tmp_path) == ["local.0"]
    assert jaxjob.restore(str(tmp_path), epoch=0)["w"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("dtype", ["uint4", "float8_e4m3"])
def test_private_checkpoints_refuse_numpy_leaves_orbax_cannot_store(tmp_path, dtype):
    """A private checkpoint (owner_process) stores NumPy leaves as they are: refused alike."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path), owner_process=0)
    leaf = np.zeros(4, getattr(ml_dtypes, dtype))
    with pytest.raises(TypeError, match=rf"array at \['cursor'\] \(dtype {dtype}, shape \(4,\)\)"):
        ckpt.save(0, {"cursor": leaf})
    assert ckpt.committed_epochs() == []


def test_every_other_low_precision_dtype_round_trips_bitwise(tmp_path):
    """int2/int4, the other float8 variants, float4 and bfloat16 are stored and restored exactly,
    and host-local NumPy leaves of the refused dtypes too (they are stored as bytes)."""
    tree = {n: jnp.arange(8).astype(n) for n in STORABLE if hasattr(jnp, n)}
    tree |= {f"np_{n}": np.arange(4).astype(getattr(ml_dtypes, n)) for n in ("uint4", "uint2")}
    tree["np_empty"] = np.zeros((0, 2), np.float32)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, tree)
    ckpt.wait_until_finished()
    restored = ckpt.load(0)
    for name, leaf in tree.items():
        assert type(restored[name]) is type(leaf) and restored[name].dtype == leaf.dtype, name
        assert np.asarray(restored[name]).tobytes() == np.asarray(leaf).tobytes(), name


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs with room for one ~1 MiB checkpoint, unmounted at teardown."""
    disk = tmp_path / "disk"
    disks.mount_tmpfs(disk, "1600k")
    yield disk
    disks.unmount(disk)


def test_background_failure_logs_one_line(small_disk, caplog):
    """A real background write failure (ENOSPC) under "warn": one WARNING record naming the epoch
    and the cause, no traceback above DEBUG (Orbax's are moved there); epoch 0 stays intact."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.arange(262144, dtype=jnp.float32)})
    job.epoch_group.add(lambda ws: {"w": ws["w"] + 1})
    jaxjob.epoch_limiter(job, 1)
    ckpt = jaxjob.CheckpointManager(str(small_disk / "run"))
    caplog.set_level(logging.DEBUG)
    runner = jaxjob.JobRunner(job, ckpt)
    assert runner.train(jaxjob.Session()) == 1
    assert [e.epoch for e in runner.save_errors] == [1]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, [r.getMessage() for r in loud]
    (line,) = loud
    assert line.name == "jaxjob.runner" and line.exc_info is None
    message = line.getMessage()
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith("Unable to write checkpoint for epoch 1: ")
    assert "No space left on device" in message
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    moved = "jaxjob.orbax"
    assert any(r.name == moved and "Orbax" in r.getMessage() for r in debug)
    assert ckpt.committed_epochs() == [0]
    assert jaxjob.restore(str(small_disk / "run"), epoch=0)["w"][:3].tolist() == [0.0, 1.0, 2.0]
    ckpt.close()  # releases the lock before the disk goes


def test_progress_line_of_a_failed_save(tmp_path, capsys):
    """Under "warn", an epoch whose save failed shows `save FAILED`, and a failure of an earlier
    epoch found at its save shows as `save of epoch 0 FAILED`; history records them."""
    (tmp_path / "f").write_text("x")  # the prefix lies under a regular file: every save fails
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    jaxjob.epoch_limiter(job, 2)
    runner = jaxjob.JobRunner(
        job, jaxjob.CheckpointManager(str(tmp_path / "f" / "c")), progress=["x"]
    )
    assert runner.train(jaxjob.Session()) == 2
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"epoch 1  x 1\.0000  time \S+s  save FAILED  save of epoch 0 FAILED", lines[0]
    )
    assert re.fullmatch(r"epoch 2  x 2\.0000  time \S+s  save FAILED", lines[1])
    assert [r.get("save_failed") for r in runner.history] == [[0, 1], [2]]


MEMORY_JOB = """
import os, sys
with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as f:  # this process, limited
    f.write(str(os.getpid()))
import jax, jax.numpy as jnp, numpy as np, jaxjob
ckpt = jaxjob.CheckpointManager(sys.argv[1])
ckpt.save(0, {"w": jnp.ones(1000)})
ckpt.wait_until_finished()
big = {f"w{i}": jax.device_put(np.full(48 * 2**20, i, np.float32)) for i in range(2)}  # 384 MiB
# Now the limit: what this process holds (page cache aside) and 200 MiB, less than the 384 a save
# of `big` needs. Set only now, so that importing and building the workspace cannot hit it.
group = sys.argv[2]
stat = dict(line.split() for line in open(os.path.join(group, "memory.stat")))
cache = int(stat["total_active_file"]) + int(stat["total_inactive_file"])
used = int(open(os.path.join(group, "memory.usage_in_bytes")).read()) - cache
with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
    f.write(str(used + 200 * 2**20))
try:
    ckpt.save(1, big)
    ckpt.wait_until_finished()
except MemoryError as err:  # the runner takes it as a failed save, under on_save_error
    print("REFUSED", err, flush=True)
with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
    f.write(str(2 * 2**30))  # the limit was for the save: closing and exiting get room again
ckpt.close()
print("COMMITTED", ckpt.committed_epochs(), flush=True)
"""


@pytest.fixture
def memory_cgroup():
    """A memory cgroup (v1) of 2 GiB until its process tightens it; skips where none can be made."""
    import uuid

    path = f"/sys/fs/cgroup/memory/jaxjob-test-{uuid.uuid4().hex[:8]}"
    try:
        os.mkdir(path)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(2 * 2**30))
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup here: {err}")
    yield path
    os.rmdir(path)


def test_a_save_that_cannot_fit_in_memory_is_refused_not_killed(memory_cgroup, tmp_path):
    """Under a cgroup limit, a save needing more host memory than is left fails, giving both."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_JOB, str(tmp_path / "run"), memory_cgroup],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # not killed by the OOM killer
    refused = re.search(
        r"REFUSED the save of epoch 1 to .* writes 384 MiB "
        r"from this process and needs about 384 MiB .* but only (\d+) MiB",
        proc.stdout,
    )
    assert refused and int(refused.group(1)) < 384, proc.stdout
    assert "COMMITTED [0]" in proc.stdout
