"""Every file of a checkpoint x every kind of damage: verify reports it, restore refuses it."""

import json
import os
import pathlib
import shutil
import tempfile

import damage
import exact_job
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.serialization import tensorstore_utils

import jaxjob
from jaxjob import testing
from jaxjob._src.base import file_table, mounts
from jaxjob._src.checkpoint import files, verify
from jaxjob._src.internals import orbax_checkpointer


def _workspace(epoch):
    key = jax.random.key(epoch)
    return {
        "w": jax.random.normal(key, (512, 1024)),  # 2 MiB: a data file the table sizes, not hashes
        "b": jnp.arange(7.0) * epoch,
        "rng": jax.random.key(epoch + 10),
        "half": jnp.full((5,), epoch + 1, jnp.bfloat16),
        "cursor": np.int64(7 * epoch + 1),  # host-local
        "steps": epoch,
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A db_prefix with committed epochs 0 and 1 of the same structure, other values."""
    return damage.save_epochs(tmp_path_factory.mktemp("matrix"), _workspace)


def _names_it(message, rel):
    if rel in message or rel == "commit_success.txt" and "no commit marker" in message:
        return True
    if rel == files.FILE_TABLE:  # another epoch's table, intact in itself: the files disagree
        return "is corrupt: " in message
    if rel == "jaxjob/manifest.json":  # another epoch's: it says which epoch it is
        return "the manifest says epoch 0" in message
    return file_table.is_data_file(rel) and "leaf " in message  # the leaf it holds, and its file


def _undetected(path, rel):
    """(rel, by what, what it said) for each of verify and restore that misses ``rel`` 's damage."""
    missed = []
    lines = verify.verify_checkpoint(path)
    if not any(_names_it(line, rel) for line in lines):
        missed.append((rel, "verify", lines))
    try:
        jaxjob.restore(path)
        missed.append((rel, "restore", "returned"))
    except jaxjob.CorruptCheckpointError as err:
        if not _names_it(str(err), rel):
            missed.append((rel, "restore", str(err)))
    except FileNotFoundError as err:  # the commit marker deleted: not a checkpoint any more
        if not _names_it(str(err), rel):
            missed.append((rel, "restore", repr(err)))
    return missed


@pytest.mark.parametrize("kind", list(damage.MATRIX))
def test_every_file_damaged_is_reported_and_refused(saved, tmp_path, kind):
    """Each file of the checkpoint, damaged this way: verify names it, restore raises."""
    original, other = os.path.join(saved, "local.1"), os.path.join(saved, "local.0")
    tried, undetected = [], []
    for i, rel in enumerate(damage.files_of(original)):
        path = str(tmp_path / str(i) / "local.1")
        shutil.copytree(original, path)
        changed = damage.MATRIX[kind](
            os.path.join(path, rel), damage.counterpart(rel, original, other)
        )
        if not changed:  # e.g. a file identical in both epochs, or one sector long
            continue
        tried.append(rel)
        undetected += _undetected(path, rel)
    assert len(tried) >= (3 if kind == "swap two sectors" else 10), (
        tried
    )  # sectors: files of 1 KiB+
    for line in undetected:
        print(*line)
    print(f"MATRIX {kind}: {len(tried)} files tried, {len(tried) - len(undetected)} detected")
    assert undetected == []


@pytest.fixture
def ram_disk():
    """A fresh directory on this machine's RAM disk (``/dev/shm``), removed afterwards."""
    if not mounts.ram_backed("/dev/shm"):
        pytest.skip("no RAM disk at /dev/shm")
    path = tempfile.mkdtemp(dir="/dev/shm", prefix="jaxjob-test-")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", list(damage.MATRIX))
def test_a_damaged_data_file_on_a_ram_disk_is_refused(saved, ram_disk, kind):
    """On a RAM disk restore reads the large data files through a memory map: an intact copy
    restores exactly, and each large data file damaged this way is named and refused."""
    original, other = os.path.join(saved, "local.1"), os.path.join(saved, "local.0")
    orbax_checkpointer.install()
    spec = tensorstore_utils.build_kvstore_tspec(str(ram_disk / "local.1"), use_ocdbt=True)
    assert '"memmap"' in json.dumps(spec)  # the reads below go through the map
    intact = str(ram_disk / "intact" / "local.1")
    shutil.copytree(original, intact)
    testing.assert_bitwise_equal(jaxjob.restore(original), jaxjob.restore(intact))
    large = [  # read in one piece of 256 KiB or more: TensorStore maps those
        rel
        for rel in damage.files_of(original)
        if file_table.is_data_file(rel) and os.path.getsize(os.path.join(original, rel)) >= 1 << 20
    ]
    assert large
    undetected = []
    for i, rel in enumerate(large):
        path = str(ram_disk / str(i) / "local.1")
        shutil.copytree(original, path)
        if damage.MATRIX[kind](os.path.join(path, rel), damage.counterpart(rel, original, other)):
            undetected += _undetected(path, rel)
    assert undetected == []


# ---- auto-resume falls back to the newest intact epoch, exactly ------------------------------


def _resume_after(reference, tmp_path, rel, kind):
    """Damages ``rel`` of the last epoch, auto-resumes, checks the fall-back and the result."""
    prefix = str(tmp_path / "ckpt")
    shutil.copytree(reference / "ckpt", prefix)
    last = exact_job.EPOCHS
    path = os.path.join(prefix, f"local.{last}")
    other = damage.counterpart(rel, path, os.path.join(prefix, f"local.{last - 1}"))
    assert damage.MATRIX[kind](os.path.join(path, rel), other)
    handler = jaxjob.DiskMetadataHandler()
    finished, workspace = exact_job.train(prefix, handler)
    assert finished == last
    loads = [h for h in handler.history if h["action"] == "checkpoint_load"]
    assert [s["epoch"] for h in loads for s in h["stats"].values()] == [last - 1]
    exact_job.dump(workspace, tmp_path / "out.npz")
    exact_job.assert_same_workspace(reference / "out.npz", tmp_path / "out.npz")


@pytest.mark.parametrize(
    ("rel", "kind"),
    [
        ("state/array_metadatas/process_0", "flip one byte"),  # crashed every restart before
        ("jaxjob/manifest.json", "delete"),  # a FileNotFoundError before
        ("state/manifest.ocdbt", "replace with another epoch's copy"),  # same size, valid OCDBT
    ],
)
def test_auto_resume_falls_back_exactly(reference, tmp_path, rel, kind):
    """The last epoch damaged outside its arrays: auto-resume reruns it and ends bitwise equal."""
    _resume_after(reference, tmp_path, rel, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flip one byte", "delete", "replace with another epoch's copy"])
def test_auto_resume_falls_back_exactly_from_any_damaged_file(reference, tmp_path, kind):
    """Every file of the last epoch in turn: auto-resume falls back and ends bitwise equal."""
    path = os.path.join(reference / "ckpt", f"local.{exact_job.EPOCHS}")
    other = os.path.join(reference / "ckpt", f"local.{exact_job.EPOCHS - 1}")
    for i, rel in enumerate(damage.files_of(path)):
        probe = tmp_path / f"probe{i}"
        shutil.copytree(path, probe)
        if not damage.MATRIX[kind](str(probe / rel), damage.counterpart(rel, path, other)):
            continue  # this damage cannot change that file
        _resume_after(reference, tmp_path / str(i), rel, kind)
