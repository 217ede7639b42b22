"""Fixtures of the checkpoint tests: an uninterrupted run of the exactness job."""

import exact_job
import pytest


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the exactness job: its checkpoints and its final workspace."""
    base = tmp_path_factory.mktemp("reference")
    last, workspace = exact_job.train(str(base / "ckpt"))
    assert last == exact_job.EPOCHS
    exact_job.dump(workspace, base / "out.npz")
    return base
