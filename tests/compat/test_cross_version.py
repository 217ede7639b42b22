"""The cross-version format check (``cross_version.py``) itself, with this test's releases."""

import re

import cross_version
import numpy as np
import pytest


def test_a_checkpoint_written_is_read_back_identical_and_a_changed_leaf_is_named(tmp_path):
    """``write`` then ``read`` (.ci/run runs them with two releases) pass; other bytes fail."""
    cross_version.write(str(tmp_path))
    cross_version.read(str(tmp_path))
    with np.load(tmp_path / "expected.npz") as npz:
        expected = {k: npz[k] for k in npz.files}
    key = next(k for k in expected if k.startswith("1|['params']['w']"))
    expected[key] = expected[key][::-1].copy()
    np.savez(tmp_path / "expected.npz", **expected)
    named = "epoch 1: ['params']['w']|jax.Array|float32 restored with other bytes"
    with pytest.raises(SystemExit, match=re.escape(named)):
        cross_version.read(str(tmp_path))
