"""The typed records of a save round: the exchanged JSON, the stats and the deleting process."""

import dataclasses
import json

import pytest

import jaxjob
from jaxjob._src.base.leaves import Kind
from jaxjob._src.manager.records import Action, LeafCheck, ProcessStats, SavePost, Stats
from jaxjob._src.manager.save import boundary
from jaxjob._src.manager.save.supersede import deleting_process


def test_a_save_post_is_the_json_processes_always_exchanged():
    """The post's JSON keeps its keys and values; from_json gives the same frozen record back."""
    cause = OSError("disk full")
    previous = jaxjob.CheckpointSaveError(2, "/ckpt/local.2", cause)
    previous.__cause__ = cause
    post = SavePost.outcome(
        previous,
        ValueError("bad leaf"),
        host_local={"['cursor']": LeafCheck(Kind.NUMPY, "int64", (2,))},
        replicated={"['c']": "abc"},
        stats={"/ckpt/local.3": Stats(3, 16, None, 0.5)},
    )
    data = json.loads(json.dumps(post.to_json()))
    assert data == {
        "previous": "OSError: disk full",
        "previous_at": [2, "/ckpt/local.2"],
        "problem": "ValueError: bad leaf",
        "host_local": {"['cursor']": {"kind": "numpy", "dtype": "int64", "shape": [2]}},
        "replicated": {"['c']": "abc"},
        "stats": {"/ckpt/local.3": {"epoch": 3, "bytes": 16, "error": None, "duration_s": 0.5}},
    }
    assert SavePost.from_json(data) == post
    with pytest.raises(dataclasses.FrozenInstanceError):
        post.problem = None


def test_stats_carry_their_action_and_send_commit_s_once_set():
    """commit_s is exchanged only once an async save committed; the action is never exchanged."""
    saved = Stats(1, 8, None, 0.25)
    assert "commit_s" not in saved.to_json() and saved.action is Action.SAVE
    committed = Stats(1, 8, None, 0.25, commit_s=1.5, action=Action.LOAD)
    assert committed.to_json()["commit_s"] == 1.5 and "action" not in committed.to_json()


def test_merged_stats_name_the_slowest_process_and_sum_the_bytes():
    """Every process's stats of one directory merge into one entry with a row per process."""
    posts = [
        ProcessStats(0, {"a.1": Stats(1, 4, None, 1.0)}),
        ProcessStats(1, {"a.1": Stats(1, 6, "OSError: full", 3.0)}),
    ]
    merged = boundary.merge_stats(posts, {"a.1": Stats(1, 4, None, 1.0)})["a.1"]
    assert merged["bytes"] == 10 and merged["duration_s"] == 3.0
    assert merged["slowest_process"] == 1 and merged["error"] == "process 1: OSError: full"
    assert [h["process"] for h in merged["hosts"]] == [0, 1]


def test_one_rule_says_which_process_deletes():
    """The nodes' one owner deletes; nodes every process saves, or mixed owners: process 0."""
    assert deleting_process([None]) == 0
    assert deleting_process([3, 3]) == 3
    assert deleting_process([3, None]) == 0
    assert deleting_process([1, 2]) == 0
