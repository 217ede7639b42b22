"""jaxjob.LocalTier: its arguments, and a manager's local tier saved and listed in-process."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import paths
import pytest

import jaxjob
from jaxjob._src.checkpoint.listing import list_tiers
from jaxjob._src.cli import main as cli


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"path": ""}, TypeError, r"LocalTier path must be a non-empty str, got ''"),
        ({"path": 3}, TypeError, r"LocalTier path must be a non-empty str, got 3"),
        ({"path": "s3://b/run"}, ValueError, r"directory on this machine's disk, got 's3://b/run'"),
        ({"path": "/x/{host}"}, ValueError, r"may hold \{process\} and no other field"),
        (
            {"path": "/x", "every_epochs": 0},
            ValueError,
            r"every_epochs must be None or an int >= 1, got 0",
        ),
        (
            {"path": "/x", "every_epochs": True},
            ValueError,
            r"every_epochs must be None or an int >= 1",
        ),
        (
            {"path": "/x", "every_seconds": -1},
            ValueError,
            r"every_seconds must be None or a positive",
        ),
        ({"path": "/x", "every_seconds": float("nan")}, ValueError, r"every_seconds must be None"),
        ({"path": "/x", "every_epochs": None}, ValueError, r"needs every_epochs or every_seconds"),
        ({"path": "/x", "keep": 2}, ValueError, r"keep must be None, a policy of jaxjob.keep"),
    ],
)
def test_bad_arguments_name_the_argument_and_what_was_given(kwargs, error, match):
    with pytest.raises(error, match=match):
        jaxjob.LocalTier(**kwargs)


def test_a_manager_refuses_a_local_that_is_not_a_local_tier(tmp_path):
    with pytest.raises(TypeError, match=r"local must be a jaxjob.LocalTier or None, got '/x'"):
        jaxjob.CheckpointManager(str(tmp_path), local="/x")


def test_directory_expands_the_process_and_the_home():
    tier = jaxjob.LocalTier("~/run/{process}", every_epochs=None, every_seconds=30)
    assert tier.directory(3) == os.path.expanduser("~/run/3")
    assert tier.keep == (jaxjob.keep.Last(2),)


def test_local_saves_keep_their_own_retention_and_are_listed_with_a_tier(tmp_path, capsys):
    ckpt = jaxjob.CheckpointManager(
        str(tmp_path / "ckpt"), local=jaxjob.LocalTier(str(tmp_path / "local"))
    )
    ckpt.save(0, {"w": jnp.zeros(3)})
    for epoch in (1, 2, 3):
        ckpt.tier("local").save(epoch, {"w": jnp.full(3, float(epoch))})
    ckpt.close()
    local = ckpt.tier("local")
    assert local.committed_epochs() == [2, 3]  # keep=Last(2)
    assert ckpt.committed_epochs() == [0]
    np.testing.assert_array_equal(jaxjob.restore(str(tmp_path / "local"))["w"], [3.0] * 3)
    manifest = json.loads((tmp_path / "local" / "local.3" / "jaxjob" / "manifest.json").read_text())
    assert manifest["tier"] == "local"
    run = json.loads((tmp_path / "ckpt" / ".jaxjob" / "run.json").read_text())["run"]
    assert manifest["run"] == run
    rows = [(r.epoch, r.tier) for r in list_tiers(str(tmp_path / "ckpt"))]
    assert rows == [(0, "persistent"), (2, "local:0"), (3, "local:0")]
    assert cli.main(["ls", str(tmp_path / "ckpt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["node", "epoch", "committed", "size", "save", "age", "tier"]
    assert [line.split()[-1] for line in lines[1:]] == ["persistent", "local:0", "local:0"]


def test_local_candidates_skip_another_run_and_say_why(tmp_path):
    other = jaxjob.CheckpointManager(
        str(tmp_path / "other"), local=jaxjob.LocalTier(str(tmp_path / "local"))
    )
    other.save(0, {"w": jnp.zeros(3)})
    other.tier("local").save(4, {"w": jnp.ones(3)})
    other.close()
    mine = jaxjob.CheckpointManager(
        str(tmp_path / "mine"), local=jaxjob.LocalTier(str(tmp_path / "local"))
    )
    mine.save(0, {"w": jnp.zeros(3)})
    epochs, why = mine.tier("local").candidates(0)
    assert epochs == []
    assert len(why) == 1 and why[0].startswith("local epoch 4: saved by another run")
    mine.tier("local").save(1, {"w": jnp.ones(3)})  # the first local save removes the other run's
    mine.close()
    assert mine.tier("local").committed_epochs() == [1]
    assert mine.tier("local").candidates(0)[0] == [1]


def test_tier_hands_out_each_tier_and_refuses_another_name(tmp_path):
    """manager.tier(name) is the persistent tier or the local one (None without local=)."""
    settings = jaxjob.LocalTier(str(tmp_path / "local"), every_epochs=2)
    ckpt = jaxjob.CheckpointManager(str(tmp_path / "ckpt"), local=settings)
    persistent, local = ckpt.tier("persistent"), ckpt.tier("local")
    assert (persistent.name, persistent.db_prefix) == ("persistent", ckpt.db_prefix)
    assert (local.name, local.db_prefix, local.settings) == (
        "local",
        str(tmp_path / "local"),
        settings,
    )
    with pytest.raises(ValueError, match=r"tier must be 'persistent' or 'local', got 'ssd'"):
        ckpt.tier("ssd")
    ckpt.close()
    assert jaxjob.CheckpointManager(str(tmp_path / "one")).tier("local") is None


def test_each_tiers_stats_reach_the_metadata_handler_tagged_with_the_tier(tmp_path):
    """The persistent tier's stats and the local tier's (one process's, no exchange) go to the
    manager's one metadata handler, each entry naming its tier; the local one writes no record."""
    handler = jaxjob.DiskMetadataHandler()
    ckpt = jaxjob.CheckpointManager(
        str(tmp_path / "ckpt"),
        metadata_handler=handler,
        local=jaxjob.LocalTier(str(tmp_path / "local")),
        async_save=False,
    )
    ckpt.set_params(["local"])
    ckpt.save(0, {"w": jnp.zeros(3)})
    ckpt.write_checkpoint_metadata(0)
    ckpt.report_checkpoint_stats("checkpoint_save")
    ckpt.tier("local").save(1, {"w": jnp.ones(3)})
    ckpt.close()
    tagged = [
        (h["action"], os.path.basename(db), entry["tier"])
        for h in handler.history
        for db, entry in h["stats"].items()
    ]
    assert tagged == [
        ("checkpoint_save", "local.0", "persistent"),
        ("checkpoint_save", "local.1", "local"),
    ]
    records = (tmp_path / "ckpt" / "jaxjob_metadata.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in records] == [0]


@pytest.mark.parametrize(
    "local", ["{root}/ckpt", "{root}/ckpt/local", "{root}", "{root}/ckpt/{{process}}"]
)
def test_a_local_tier_overlapping_the_db_prefix_is_refused(tmp_path, local):
    with pytest.raises(
        ValueError, match=r"overlaps the db_prefix .*: the two tiers need directories apart"
    ):
        jaxjob.CheckpointManager(
            str(tmp_path / "ckpt"), local=jaxjob.LocalTier(local.format(root=tmp_path))
        )


def test_a_local_tier_beside_the_db_prefix_is_accepted(tmp_path):
    jaxjob.CheckpointManager(
        str(tmp_path / "ckpt"), local=jaxjob.LocalTier(f"{tmp_path}/ckpt-local/{{process}}")
    )


def _two_node_job():
    job = jaxjob.Job()
    with jaxjob.Node("a"), job.init_group:
        jaxjob.Task(lambda ws: {"x": jnp.arange(4.0)})
    with jaxjob.Node("b"), job.init_group:
        jaxjob.Task(lambda ws: {"cursor": np.int64(0)}, jit=False)
    job.epoch_group.add(lambda ws: {"x": ws["x"] * 1.5 + 1})
    job.epoch_group.add(lambda ws: {"cursor": np.int64(ws["cursor"] + 1)}, jit=False)
    jaxjob.epoch_limiter(job, 4)
    return job


def test_a_multi_node_manager_resumes_every_node_from_its_local_tier(tmp_path, caplog):
    """Epochs 0 and 4 persistent, 1-3 local for every node; with persistent 4 lost, the rerun
    resumes from local 3 and ends as the uninterrupted run did."""

    def manager():
        local = jaxjob.LocalTier(str(tmp_path / "local"))
        return jaxjob.MultiNodeCheckpointManager(str(tmp_path / "ckpt"), local=local)

    first = jaxjob.Session()
    runner = jaxjob.JobRunner(_two_node_job(), (ckpt := manager()), save_every_epochs=10)
    assert runner.train(first) == 4
    ckpt.close()
    assert [r["saved_to"] for r in runner.history] == ["local"] * 3 + ["persistent"]
    local = sorted(os.listdir(tmp_path / "local"))
    # keep=Last(2), for every node (the epoch counter's is the default node, "local")
    assert local == ["a.2", "a.3", "b.2", "b.3", "local.2", "local.3"]
    for node in ("a", "b", "local"):
        shutil.rmtree(tmp_path / "ckpt" / f"{node}.4")  # the final epoch lost: 0 is the newest
    (tmp_path / "ckpt" / "jaxjob_metadata.jsonl").write_text('{"event": "commit", "epoch": 0}\n')
    again = jaxjob.Session()
    with caplog.at_level(logging.INFO, logger="jaxjob"):
        jaxjob.JobRunner(_two_node_job(), (ckpt := manager()), save_every_epochs=10).train(again)
    ckpt.close()
    assert "Resuming from epoch 3 of the local tier" in caplog.text
    np.testing.assert_array_equal(again.workspace["x"], first.workspace["x"])
    assert again.workspace["cursor"] == first.workspace["cursor"] == 4


def test_a_local_tier_through_a_symlink_into_the_db_prefix_is_refused(tmp_path):
    """A link that leads into the db_prefix is followed: the real locations overlap."""
    (tmp_path / "ckpt").mkdir()
    os.symlink(tmp_path / "ckpt", tmp_path / "alias")
    with pytest.raises(ValueError, match=r"overlaps the db_prefix") as err:
        jaxjob.CheckpointManager(
            str(tmp_path / "ckpt"), local=jaxjob.LocalTier(f"{tmp_path}/alias/fast/{{process}}")
        )
    message = str(err.value)
    assert f"'{tmp_path}/alias/fast/{{process}}'" in message and f"'{tmp_path}/ckpt'" in message
    assert f"really {tmp_path}/ckpt/fast/0" in message  # the real location, not yet made


def test_a_db_prefix_through_a_symlink_into_the_local_tier_is_refused(tmp_path):
    (tmp_path / "fast").mkdir()
    os.symlink(tmp_path / "fast", tmp_path / "alias")
    with pytest.raises(ValueError, match=r"overlaps the db_prefix"):
        jaxjob.CheckpointManager(
            str(tmp_path / "alias" / "ckpt"), local=jaxjob.LocalTier(str(tmp_path / "fast"))
        )


@pytest.fixture
def bind_mount(tmp_path):
    """``bind(source, target)``: ``mount --bind`` (unmounted after the test); skips where
    mounting is not permitted (not root, or no CAP_SYS_ADMIN in this container)."""
    mounted = []

    def bind(source, target):
        os.makedirs(target, exist_ok=True)
        proc = subprocess.run(
            ["mount", "--bind", str(source), str(target)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"mount --bind is not permitted here: {proc.stderr.strip()}")
        mounted.append(target)

    yield bind
    for target in reversed(mounted):
        subprocess.run(["umount", str(target)], check=True)


def test_a_local_tier_on_a_bind_mount_of_the_db_prefix_is_refused(tmp_path, bind_mount):
    """A bind mount shows the db_prefix under another path that no link resolves: the
    device and inode of the directories give it away."""
    (tmp_path / "ckpt").mkdir()
    bind_mount(tmp_path / "ckpt", tmp_path / "mnt")
    with pytest.raises(ValueError, match=r"overlaps the db_prefix") as err:
        jaxjob.CheckpointManager(
            str(tmp_path / "ckpt"), local=jaxjob.LocalTier(f"{tmp_path}/mnt/{{process}}")
        )
    assert f"process 0's local directory '{tmp_path}/mnt/0'" in str(err.value)
    assert "lies inside the db_prefix" in str(err.value)


def test_a_db_prefix_on_a_bind_mount_of_the_local_tier_is_refused(tmp_path, bind_mount):
    (tmp_path / "fast").mkdir()
    bind_mount(tmp_path / "fast", tmp_path / "mnt")
    with pytest.raises(ValueError, match=r"overlaps the db_prefix"):
        jaxjob.CheckpointManager(
            str(tmp_path / "mnt" / "run" / "ckpt"), local=jaxjob.LocalTier(str(tmp_path / "fast"))
        )


def test_a_bind_mount_beside_the_db_prefix_is_accepted(tmp_path, bind_mount):
    (tmp_path / "disk" / "ckpt").mkdir(parents=True)
    (tmp_path / "disk" / "fast").mkdir()
    bind_mount(tmp_path / "disk" / "fast", tmp_path / "mnt")
    jaxjob.CheckpointManager(
        str(tmp_path / "disk" / "ckpt"), local=jaxjob.LocalTier(f"{tmp_path}/mnt/{{process}}")
    ).close()


def _launch_two(ckpt, *locals_):
    """Two processes of one job on this machine (jaxjob launch, 127.0.0.1) build a two-tier
    manager with each of ``locals_``: ``(exit status, {(local, process): (kind, message)},
    output)``."""
    argv = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--", sys.executable]
    script = os.path.join(paths.JOBS, "mp_local_tier.py")
    proc = subprocess.run(
        [*argv, script, str(ckpt), *map(str, locals_)], capture_output=True, text=True, timeout=180
    )
    output = proc.stdout + proc.stderr
    records = {}
    for line in output.splitlines():
        match = re.match(r"\[process=\d+\] (MADE|REFUSED) (.*)", line)
        if match:
            record = json.loads(match.group(2))
            records[record["local"], record["process"]] = (match.group(1), record.get("message"))
    return proc.returncode, records, output


def test_two_processes_of_one_machine_without_process_in_the_path_are_refused(tmp_path):
    """Without {process} both processes would share one local directory (a lock error, then
    an abort): every process refuses it at construction, naming the path and the fix; with
    {process} the same job builds its manager."""
    shared, own = f"{tmp_path}/fast", f"{tmp_path}/fast/{{process}}"
    code, records, output = _launch_two(tmp_path / "ckpt", shared, own)
    assert code == 0 and sorted(records) == sorted(
        [(shared, 0), (shared, 1), (own, 0), (own, 1)]
    ), output[-3000:]
    for process in (0, 1):
        kind, message = records[shared, process]
        assert kind == "REFUSED", output[-3000:]
        assert f"LocalTier path '{shared}'" in message, message
        assert "processes 0 and 1" in message and "add {process}" in message, message
        assert records[own, process] == ("MADE", None), output[-3000:]
