"""A host-memory budget (``max_host_bytes``): saves and restores stay within workspace + budget."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob
from jaxjob._src.base import memory
from jaxjob._src.base.errors import CorruptCheckpointError
from jaxjob._src.checkpoint import host_budget

MiB = 2**20
BUDGET = 16 * MiB
# What a restore holds beside its arrays and its budget whatever the workspace's size: the
# manifest, the checksum tables, Orbax's and TensorStore's objects for 16 leaves.
BOOKKEEPING = 1 * MiB

# One process's part: save (or restore) 16 leaves of 8 MiB, reporting the growth of its peak
# resident memory (VmHWM, reset through /proc/self/clear_refs) over what it held before.
CHILD = r"""
import json, sys
import jax.numpy as jnp, numpy as np, jaxjob

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

def peak_growth(run):
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak starts again from what is resident now
    out = run()
    return status("VmHWM") - base, out

prefix, budget, step = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
if step == "save":
    ws = {f"w{i}": jnp.full((2**21,), i, jnp.float32) for i in range(16)}  # 16 x 8 MiB
    ckpt = jaxjob.CheckpointManager(prefix, max_host_bytes=budget)
    ckpt.save(0, {"w0": ws["w0"]})  # what a first save loads, loaded
    ckpt.wait_until_finished()

    def save():
        ckpt.save(1, ws)
        ckpt.wait_until_finished()

    grown, _ = peak_growth(save)
else:
    jaxjob.restore(prefix, epoch=0, max_host_bytes=budget)  # what a first restore loads
    grown, out = peak_growth(lambda: jaxjob.restore(prefix, epoch=1, max_host_bytes=budget))
    grown -= sum(x.nbytes for x in out.values())  # beside the restored workspace
    assert all(np.array_equal(out[f"w{i}"], np.full(2**21, i, np.float32)) for i in range(16))
print(json.dumps(grown))
"""


def _grown(prefix, budget, step):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(prefix), json.dumps(budget), step],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_save_and_a_restore_stay_within_the_workspace_plus_the_budget(tmp_path):
    budgeted, free = tmp_path / "budgeted", tmp_path / "free"
    saved = _grown(budgeted, BUDGET, "save")
    restored = _grown(budgeted, BUDGET, "restore")
    assert saved <= BUDGET, f"a 128 MiB save grew the peak by {saved / MiB:.1f} MiB"
    assert restored <= BUDGET + BOOKKEEPING, (
        f"a 128 MiB restore held {restored / MiB:.1f} MiB beside the workspace"
    )
    # without a budget the same save copies the workspace, the same restore holds more
    saved_free = _grown(free, None, "save")
    restored_free = _grown(free, None, "restore")
    assert saved_free > 96 * MiB, f"{saved_free / MiB:.1f} MiB"
    assert restored_free > BUDGET + BOOKKEEPING, f"{restored_free / MiB:.1f} MiB"


def _workspace():
    return {
        "params": {f"layer{i}": jnp.arange(1000, dtype=jnp.float32) + i for i in range(6)},
        "step": jnp.asarray(7),
        "host": np.arange(300, dtype=np.int64),
        "key": jax.random.key(3),
        "lr": 0.5,
    }


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert type(x) is type(y)


def test_a_budgeted_restore_gives_what_an_unbudgeted_one_gives(tmp_path):
    ckpt = jaxjob.CheckpointManager(str(tmp_path), max_host_bytes=5000)
    ckpt.save(0, _workspace())
    ckpt.wait_until_finished()
    whole = jaxjob.restore(str(tmp_path))
    for budget in (1, 5000, 10**9):
        _same(jaxjob.restore(str(tmp_path), max_host_bytes=budget), whole)
    part = jaxjob.restore(str(tmp_path), leaves=["params/layer3", "host"], max_host_bytes=4000)
    assert sorted(part) == ["host", "params/layer3"]
    np.testing.assert_array_equal(part["params/layer3"], np.arange(1000) + 3)
    _same(ckpt.load(0), whole)


def test_a_damaged_leaf_is_named_under_a_budget_as_without_one(tmp_path):
    import damage

    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, _workspace())
    ckpt.wait_until_finished()
    damage.flip_bytes(str(tmp_path / "local.0"))
    with pytest.raises(CorruptCheckpointError) as whole:
        jaxjob.restore(str(tmp_path))
    with pytest.raises(CorruptCheckpointError) as budgeted:
        jaxjob.restore(str(tmp_path), max_host_bytes=4000)
    assert "checksum" in str(whole.value) or "damaged" in str(whole.value)
    assert str(budgeted.value) == str(whole.value)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1GiB"])
def test_a_budget_that_is_not_a_positive_int_is_refused(bad):
    expected = f"max_host_bytes must be None or a positive number of bytes (an int), got {bad!r}"
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        jaxjob.CheckpointOptions(max_host_bytes=bad)
    with pytest.raises(ValueError, match="max_host_bytes"):
        jaxjob.restore("/nonexistent", max_host_bytes=bad)


def test_groups_fill_each_up_to_the_budget_in_saved_order():
    sizes = {"a": 6, "b": 3, "c": 2, "d": 9, "e": 1}
    assert host_budget.groups(sizes, 8) == [["a", "c"], ["b", "e"], ["d"]]
    assert host_budget.groups(sizes, None) == [list(sizes)]
    assert host_budget.groups(sizes, 100) == [list(sizes)]
    assert host_budget.groups({}, 8) == []
    for budget in (1, 3, 7, 9, 12):
        got = host_budget.groups(sizes, budget)
        assert sorted(n for g in got for n in g) == sorted(sizes)
        assert all(len(g) == 1 or sum(sizes[n] for n in g) <= budget for g in got)


def test_freed_buffers_go_back_to_the_kernel_under_glibc():
    glibc = sys.platform.startswith("linux") and "glibc" in " ".join(
        __import__("platform").libc_ver()
    )
    assert memory.return_freed_buffers() is glibc
    assert memory.return_freed_buffers() is glibc  # once; the same answer after


def test_a_save_within_the_budget_still_copies_on_the_training_thread_only_when_it_fits():
    from jaxjob._src.manager.save import background_start

    small = background_start.SMALL_SAVE_BYTES // 2
    assert background_start.eligible("/tmp/x", small, async_save=True)
    assert background_start.eligible("/tmp/x", small, async_save=True, max_host_bytes=small)
    assert not background_start.eligible("/tmp/x", small, async_save=True, max_host_bytes=small - 1)


def test_a_check_of_every_leaf_reads_batches_within_the_budget(tmp_path, monkeypatch):
    """The resume decision's and verify()'s read of every leaf: in batches of at most the
    budget (256 MiB without one), through the manager's reader too."""
    from jaxjob._src.checkpoint.io import CheckpointIO

    ws = {f"w{i}": jnp.arange(1000, dtype=jnp.float32) + i for i in range(6)}  # 4000 B each
    ckpt = jaxjob.CheckpointManager(str(tmp_path), max_host_bytes=9000)
    ckpt.save(0, ws)
    ckpt.wait_until_finished()
    batches = []
    real = CheckpointIO.restore

    def spying(self, path, item, tree):
        if item == "state":
            batches.append(sum(host_budget.host_bytes(t) for t in tree.values()))
        return real(self, path, item, tree)

    monkeypatch.setattr(CheckpointIO, "restore", spying)
    assert ckpt.verify(0) == []  # the manager's reader, under its budget
    assert batches and max(batches) <= 9000 and sum(batches) >= 6 * 4000, batches
    batches.clear()
    assert jaxjob.CheckpointManager(str(tmp_path)).verify(0) == []  # no budget: one batch
    assert len(batches) == 1 and batches[0] >= 6 * 4000, batches
