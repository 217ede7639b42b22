"""Checksums on two real processes: each records its own shards; both agree on the fallback."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from damage import flip_file

from jaxjob._src.checkpoint import verify

SCRIPT = textwrap.dedent(
    """
    import sys
    import jaxjob
    jaxjob.distributed.initialize()
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = NamedSharding(mesh, P("x"))
    job = jaxjob.Job()
    job.init_group.add(
        lambda ws: {"x": jax.lax.with_sharding_constraint(jnp.arange(4096.0), spec)}
    )
    job.init_group.add(lambda ws: {"cursor": np.int64(100 * jax.process_index())}, jit=False)
    job.epoch_group.add(lambda ws: {"x": ws["x"] * 1.5 + 1})
    job.epoch_group.add(lambda ws: {"cursor": ws["cursor"] + 1}, jit=False)
    jaxjob.epoch_limiter(job, 3)
    session = jaxjob.Session()
    last = jaxjob.JobRunner(job, jaxjob.CheckpointManager(sys.argv[1])).train(session)
    x = session.workspace["x"]
    local = [float(s.data.sum()) for s in x.addressable_shards]
    print("RESULT", jax.process_index(), last, int(session.workspace["cursor"]), local)
    """
)


def _launch(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--devices-per-process", "2"]
        + ["--", sys.executable, str(tmp_path / "job.py"), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [line.split("RESULT ")[1] for line in proc.stdout.splitlines() if "RESULT" in line]
    return sorted(results), proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_process_checksums_its_shards_and_all_fall_back_to_the_same_epoch(tmp_path):
    """2 processes: per-process records; a damaged shard of process 1 makes both rerun epoch 3."""
    clean, _ = _launch(tmp_path)
    path = str(tmp_path / "ckpt" / "local.3")
    files = sorted(os.listdir(os.path.join(path, "jaxjob")))
    assert "checksums.0.json" in files and "checksums.1.json" in files
    with open(os.path.join(path, "jaxjob", "manifest.json")) as f:
        stored = {leaf["path"]: leaf["name"] for leaf in json.load(f)["leaves"]}
    for process in (0, 1):
        with open(os.path.join(path, "jaxjob", f"checksums.{process}.json")) as f:
            doc = json.load(f)
        assert doc["process"] == process
        x_shards = [index for index, *_ in doc["leaves"][stored["['x']"]]]  # 2 of 4 shards
        assert x_shards == [
            [[2048 * process + 1024 * i, 2048 * process + 1024 * (i + 1)]] for i in (0, 1)
        ]
        (row,) = [index for index, *_ in doc["leaves"][stored["['cursor']"]]]  # its row
        assert row[0] == [process, process + 1]
    assert verify.verify_checkpoint(path) == []
    data = os.path.join(path, "state", "ocdbt.process_1", "d")
    victim = max(sorted(os.scandir(data), key=lambda e: e.name), key=lambda e: e.stat().st_size)
    flip_file(victim)
    (line,) = verify.verify_checkpoint(path)  # a checksum mismatch or a zstd decode error
    assert line.startswith("leaf x (['x']") and "epoch 3" in line and victim.path in line
    resumed, log = _launch(tmp_path)
    assert "The checkpoint of epoch 3 is damaged" in log
    assert resumed == clean
    assert verify.verify_checkpoint(path) == []
