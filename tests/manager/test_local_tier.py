"""jaxjob.LocalTier: its arguments, and a manager's local tier saved and listed in-process."""

import json
import os

import jax.numpy as jnp
import numpy as np
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
        ckpt.save_local(epoch, {"w": jnp.full(3, float(epoch))})
    ckpt.close()
    local = ckpt.tier_manager("local")
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
    other.save_local(4, {"w": jnp.ones(3)})
    other.close()
    mine = jaxjob.CheckpointManager(
        str(tmp_path / "mine"), local=jaxjob.LocalTier(str(tmp_path / "local"))
    )
    mine.save(0, {"w": jnp.zeros(3)})
    epochs, why = mine.local_candidates(0)
    assert epochs == []
    assert len(why) == 1 and why[0].startswith("local epoch 4: saved by another run")
    mine.save_local(1, {"w": jnp.ones(3)})  # the first local save removes the other run's copy
    mine.close()
    assert mine.tier_manager("local").committed_epochs() == [1]
    assert mine.local_candidates(0)[0] == [1]


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
