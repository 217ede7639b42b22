"""Two real processes (gloo on 127.0.0.1) run one job with a sharded global array: save, resume."""

import json
import os
import subprocess
import sys
import textwrap

import paths
import pytest

from jaxjob._src.checkpoint import manifest, run_identity

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
    job.init_group.add(lambda ws: {"x": jax.lax.with_sharding_constraint(jnp.arange(8.0), spec)})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    jaxjob.epoch_limiter(job, int(sys.argv[2]))
    session = jaxjob.Session()
    last = jaxjob.JobRunner(job, jaxjob.CheckpointManager(sys.argv[1])).train(session)
    x = session.workspace["x"]
    local = sorted(float(s.data[0]) for s in x.addressable_shards)
    print("RESULT", jax.process_index(), last, x.sharding == spec, local)
    """
)


def _launch(tmp_path, epochs):
    (tmp_path / "job.py").write_text(SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxjob.cli",
            "launch",
            "-n",
            "2",
            "--devices-per-process",
            "2",
            "--",
            sys.executable,
            str(tmp_path / "job.py"),
            str(tmp_path / "ckpt"),
            str(epochs),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(line.split("RESULT ")[1] for line in proc.stdout.splitlines() if "RESULT" in line)


def _checkpoint_dirs(prefix):
    """The directories under ``prefix`` but ``.jaxjob`` (the run id and the history, no lock)."""
    assert sorted(os.listdir(prefix / ".jaxjob")) == ["history", "run.json"]
    return sorted(p.name for p in prefix.iterdir() if p.is_dir() and p.name != ".jaxjob")


def test_two_processes_train_checkpoint_and_resume(tmp_path):
    """2 processes x 2 devices: train 2 epochs, then resume to 3; each host keeps its own shards."""
    assert _launch(tmp_path, 2) == ["0 2 True [2.0, 4.0]", "1 2 True [6.0, 8.0]"]
    assert _launch(tmp_path, 3) == ["0 3 True [3.0, 5.0]", "1 3 True [7.0, 9.0]"]
    assert _checkpoint_dirs(tmp_path / "ckpt") == ["local.0", "local.1", "local.2", "local.3"]


def _run_script(tmp_path, script, epochs):
    """Runs tests/``script`` on 2 processes; returns each process's RESULT json, by process."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--", sys.executable]
        + [os.path.join(paths.JOBS, script), str(tmp_path), str(epochs)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [line.split("RESULT ")[1] for line in proc.stdout.splitlines() if "RESULT" in line]
    return {r["process"]: r for r in map(json.loads, results)}


def test_multi_node_manager_on_two_processes(tmp_path):
    """Two logical nodes on 2 processes: per-node checkpoints, resume, gathering named leaves."""
    outputs = [_run_script(tmp_path, "mp_nodes.py", epochs) for epochs in (2, 3)]
    for process in (0, 1):
        first, second = outputs[0][process], outputs[1][process]
        assert first["last"] == 2 and second["last"] == 3
        assert first["gathered"] and not first["missing_epoch"]
        assert (first["w_0"], first["w_1"]) == ([2.0], [4.0])
        assert (second["w_0"], second["w_1"]) == ([3.0], [8.0])  # resumed, not restarted
        assert second["cursor"] == [process, 3]  # each process's own copy, from trainer_1
    names = _checkpoint_dirs(tmp_path)
    assert names == [f"{n}.{e}" for n in ("local", "trainer_0", "trainer_1") for e in range(4)]


def test_each_process_saves_its_own_node(tmp_path):
    """The caffe2 style: process i runs Node trainer_i alone and saves only trainer_i.<epoch>;
    resume continues each process's own leaves; process 0 alone gathers every node's leaves."""
    outputs = [_run_script(tmp_path, "mp_private_nodes.py", epochs) for epochs in (2, 3)]
    for process in (0, 1):
        first, second = outputs[0][process], outputs[1][process]
        own = {"cursor", "jaxjob/epochs_done", "key", f"w_{process}"}
        assert set(first["names"]) == set(second["names"]) == own  # only its own node's leaves
        assert first["w"] == [(process + 1) * 4.0 - 1] * 3  # w -> 2w + 1 from w = process
        assert second["w"] == [(process + 1) * 8.0 - 1] * 3  # resumed at epoch 2, not restarted
        assert second["cursor"] == [process, 3] and second["key"] == [0, process]
    gathered = outputs[1][0]
    assert gathered["gathered"] and not gathered["missing_epoch"]
    assert gathered["gathered_w"] == {"w_0": [7.0] * 3, "w_1": [15.0] * 3}
    assert gathered["restored_w"] == [15.0] * 3  # jaxjob.restore of process 1's node, on process 0
    names = _checkpoint_dirs(tmp_path)
    assert names == [f"trainer_{i}.{e}" for i in (0, 1) for e in range(4)]
    runs = {manifest.read(str(tmp_path / name)).run for name in names}
    assert runs == {run_identity.read(str(tmp_path))}  # one run, whichever process created it


@pytest.fixture(scope="module")
def exchanges(tmp_path_factory):
    """Every process's exchanges per epoch of 4-epoch jobs (jobs/mp_exchanges.py), by variant."""
    return _run_script(tmp_path_factory.mktemp("exchanges"), "mp_exchanges.py", 4)


@pytest.mark.parametrize("kind", ["single", "multi", "private"])
def test_a_saved_epoch_costs_one_exchange_more_than_an_unsaved_one(exchanges, kind):
    """On 2 processes an epoch without a save ends with one exchange (the boundary check); a saved
    epoch, with either manager, makes exactly one more, which carries the access check and the
    stats (the report names both processes), for every node at once."""
    names = {"single": "node 'local'", "multi": "nodes ['a', 'b', 'local']"}
    names["private"] = "nodes ['trainer_0', 'trainer_1']"
    dbs = {"single": ["local"], "multi": ["a", "b", "local"], "private": ["trainer_0", "trainer_1"]}
    for process in (0, 1):
        plain = exchanges[process]["none/1"]["exchanges"]
        assert plain == [[f"the stop conditions of epoch {e}"] for e in (1, 2, 3)]
        without = exchanges[process][f"{kind}/1000"]["exchanges"]
        saved = exchanges[process][f"{kind}/1"]["exchanges"]
        assert without == plain
        assert [len(e) for e in saved] == [len(e) + 1 for e in without] == [2, 2, 2]
        assert [e[1] for e in saved] == [
            f"the save of epoch {e} of {names[kind]}" for e in (1, 2, 3)
        ]
        reports = exchanges[process][f"{kind}/1"]["reports"]
        assert len(reports) == 5  # epochs 0 to 4
        for epoch, report in enumerate(reports):
            assert report == {
                f"{db}.{epoch}": [0, 1] if kind != "private" else [int(db[-1])] for db in dbs[kind]
            }


DISAGREE = textwrap.dedent(
    """
    import json, sys
    import jaxjob
    jaxjob.distributed.initialize()
    import jax, jax.numpy as jnp, numpy as np

    me = jax.process_index()
    ckpt = jaxjob.CheckpointManager(sys.argv[1], timeout_s=30)
    errors = []
    for epoch, ws in enumerate([
        {"cursor": np.zeros(2 + me)},  # host-local leaves of different shapes
        {"c": jnp.asarray(float(me))},  # one-device jax.Arrays holding different values
    ]):
        try:
            ckpt.save(epoch, ws)
            errors.append(None)
        except ValueError as err:
            errors.append(str(err))
    ckpt.save(2, {"c": jnp.asarray(1.0), "cursor": np.zeros(2)})
    ckpt.wait_until_finished()
    result = {"process": me, "errors": errors, "committed": ckpt.committed_epochs()}
    print("RESULT", json.dumps(result))
    """
)


def _launch_text(tmp_path, text):
    """Runs the script ``text`` on 2 processes with a db_prefix; returns both RESULT jsons."""
    (tmp_path / "script.py").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--", sys.executable]
        + [str(tmp_path / "script.py"), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "RESULT" in line]
    assert len(lines) == 2, proc.stdout[-3000:]
    return [json.loads(line.split("RESULT ")[1]) for line in lines]


def test_processes_disagreeing_on_a_leaf_fail_the_save_on_every_process(tmp_path):
    """Host-local leaves must match in shape, one-device jax.Arrays in value: else all raise."""
    results = _launch_text(tmp_path, DISAGREE)
    for result in results:
        shapes, values = result["errors"]
        assert "host-local leaf ['cursor'] differs between processes" in shapes
        assert "'shape': [2]} on process 0, {'kind': 'numpy', 'dtype': 'float64'" in shapes
        assert "'shape': [3]} on process 1" in shapes
        assert "workspace leaf ['c'] is a jax.Array on one device of each process" in values
        assert "its value on process 1 differs from process 0's" in values
        assert result["committed"] == [2]  # the failed saves left nothing behind


LOAD_THEN_SAVE = textwrap.dedent(
    """
    import json, sys
    import jaxjob
    jaxjob.distributed.initialize()
    import jax, jax.numpy as jnp

    me = jax.process_index()
    ckpt = jaxjob.MultiNodeCheckpointManager(sys.argv[1], timeout_s=30, node_processes={"a": 1})
    ckpt.init(["a", "b"], key_nodes={"xa": "a", "xb": "b"})
    ws = {"xb": jnp.ones(2), **({"xa": jnp.zeros(2)} if me == 1 else {})}
    ckpt.save(0, ws)
    ckpt.report_checkpoint_stats("checkpoint_save")
    ckpt.wait_until_finished()
    session = jaxjob.Session()
    loaded = ckpt.load_blobs_locally(["a", "b"], ["xb"], 0, session)  # every node, every process
    ckpt.report_checkpoint_stats("checkpoint_partial_load")
    ckpt.save(1, ws)
    ckpt.report_checkpoint_stats("checkpoint_save")
    ckpt.wait_until_finished()
    actions = [h["action"] for h in ckpt.metadata_handler.history]
    result = {"process": me, "loaded": loaded, "actions": actions,
              "committed": ckpt.committed_epochs()}
    print("RESULT", json.dumps(result))
    """
)


SLOW_PRIMARY = textwrap.dedent(
    """
    import asyncio, json, sys
    import jaxjob
    jaxjob.distributed.initialize()
    import jax, jax.numpy as jnp
    from orbax.checkpoint._src.path import atomicity

    me = jax.process_index()
    if me == 0:  # the primary host of the shared node creates each save's directories late
        create = atomicity.AtomicRenameTemporaryPath.create  # the checkpoint's and its items'
        async def slow_create(self):
            await asyncio.sleep(1.0)
            return await create(self)
        atomicity.AtomicRenameTemporaryPath.create = slow_create
    ckpt = jaxjob.MultiNodeCheckpointManager(
        sys.argv[1], timeout_s=30, write_timeout_s=15, node_processes={"a": 1}
    )
    ckpt.init(["a", "b"], key_nodes={"xa": "a", "xb": "b"})
    ws = {"xb": jnp.ones(2), **({"xa": jnp.zeros(2)} if me == 1 else {})}
    errors = []
    for epoch in range(2):
        try:
            ckpt.save(epoch, ws)
            ckpt.wait_until_finished()
        except jaxjob.CheckpointSaveError as err:
            errors.append(str(err))
    result = {"process": me, "committed": ckpt.committed_epochs(), "errors": errors}
    print("RESULT", json.dumps(result))
    """
)


def test_a_private_node_on_one_process_leaves_the_shared_saves_in_step(tmp_path):
    """Process 1 alone saves node a, so it makes more Orbax saves than process 0: Orbax's
    per-process save count (which keys its asynchronous directory-creation signals) differs.
    Process 1 then wrote node b before process 0, its primary host, had created the
    directories (FileNotFoundError there, process 0 waiting out the write timeout at Orbax's
    barrier); it must wait for them, however late."""
    results = _launch_text(tmp_path, SLOW_PRIMARY)
    for result in results:
        assert result["errors"] == []
        assert result["committed"] == [0, 1]


def test_a_load_of_another_process_node_keeps_the_processes_in_step(tmp_path):
    """Every process loads every node (one is process 1's own), then saves: every process
    reports the save's stats the same way (no exchange on one process only), and both commit."""
    results = _launch_text(tmp_path, LOAD_THEN_SAVE)
    for result in results:
        assert result["loaded"] is True and result["committed"] == [0, 1]
        assert result["actions"] == [
            "checkpoint_save",
            "checkpoint_partial_load",
            "checkpoint_save",
        ]
