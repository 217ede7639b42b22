"""Every file of a checkpoint x every kind of damage: verify reports it, restore refuses it."""

import os
import shutil

import damage
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob
from jaxjob._src.base import file_table
from jaxjob._src.checkpoint import files, verify


def _workspace(epoch):
    key = jax.random.key(epoch)
    return {
        "w": jax.random.normal(key, (64, 1024)),  # 256 KiB: a data file checked by size on restore
        "b": jnp.arange(7.0) * epoch,
        "rng": jax.random.key(epoch + 10),
        "half": jnp.full((5,), epoch + 1, jnp.bfloat16),
        "cursor": np.int64(7 * epoch + 1),  # host-local
        "steps": epoch,
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A db_prefix with committed epochs 0 and 1 of the same structure, other values."""
    prefix = str(tmp_path_factory.mktemp("matrix"))
    ckpt = jaxjob.CheckpointManager(prefix)
    for epoch in (0, 1):
        ckpt.save(epoch, jaxjob.Workspace(_workspace(epoch)))
    ckpt.close()
    return prefix


def _names_it(message, rel):
    if rel in message or rel == "commit_success.txt" and "no commit marker" in message:
        return True
    if rel == files.FILE_TABLE:  # another epoch's table, intact in itself: the files disagree
        return "is corrupt: " in message
    return file_table.is_data_file(rel) and "leaf " in message  # the leaf it holds, and its file


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
        lines = verify.verify_checkpoint(path)
        if not any(_names_it(line, rel) for line in lines):
            undetected.append((rel, "verify", lines))
        try:
            jaxjob.restore(path)
            undetected.append((rel, "restore", "returned"))
        except jaxjob.CorruptCheckpointError as err:
            if not _names_it(str(err), rel):
                undetected.append((rel, "restore", str(err)))
        except FileNotFoundError as err:  # the commit marker deleted: not a checkpoint any more
            if not _names_it(str(err), rel):
                undetected.append((rel, "restore", repr(err)))
    assert len(tried) >= (3 if kind == "swap two sectors" else 10), (
        tried
    )  # sectors: files of 1 KiB+
    for line in undetected:
        print(*line)
    assert undetected == []
