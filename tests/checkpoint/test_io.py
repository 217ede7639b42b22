"""jaxjob's one handle on Orbax: open, save_async, restore, drain, close."""

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxjob._src.base import faults
from jaxjob._src.checkpoint import codec, files, manifest, run_identity, storage, verify
from jaxjob._src.checkpoint.io import CheckpointIO
from jaxjob._src.checkpoint.layout import db_name, is_committed


def _encoded(prefix, epoch, ws, store):
    found, flat = manifest.build(epoch, "local", ws, {}, None, run=run_identity.ensure(prefix))
    encoded, _ = storage.encode(found, flat, store)
    return found, encoded


def _stored(path):
    """Stored name -> a NumPy target of each state leaf of the checkpoint at ``path``."""
    found, _ = files.read_checked(path)
    return {s.name: np.zeros(s.shape, s.dtype) for s in found.leaves.values()}


@pytest.mark.parametrize("write_timeout_s", [None, 60.0], ids=["synchronous", "background"])
def test_a_save_commits_once_drained_and_reads_back(tmp_path, write_timeout_s):
    """save_async then drain commits the checkpoint; restore reads its leaves through the handle."""
    prefix, ws = str(tmp_path), {"w": jnp.arange(4.0), "b": jnp.ones(2, jnp.int32)}
    found, encoded = _encoded(prefix, 0, ws, codec.SharedCodec())
    path = db_name(0, "local", prefix)
    with CheckpointIO(prefix, codec.SharedCodec(), write_timeout_s=write_timeout_s) as io:
        assert io.save_async(path, encoded, found, nbytes=storage.nbytes(encoded)) is None
        assert io.asynchronous == (write_timeout_s is not None)
        io.drain(path)
        assert is_committed(path)
        restored = io.restore(path, storage.STATE, _stored(path))
    assert [restored[n].tolist() for n in sorted(restored)] == [[1, 1], [0.0, 1.0, 2.0, 3.0]]
    assert verify.verify_checkpoint(path) == []


def test_a_closed_handle_opens_a_new_checkpointer_on_its_next_use(tmp_path, monkeypatch):
    """close releases Orbax's checkpointer; open is idempotent; a later read opens another."""
    prefix = str(tmp_path)
    found, encoded = _encoded(prefix, 0, {"w": jnp.arange(3.0)}, codec.SharedCodec())
    path = db_name(0, "local", prefix)
    opened = []
    init = ocp.Checkpointer.__init__

    def counted(self, *args, **kwargs):
        opened.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(ocp.Checkpointer, "__init__", counted)
    io = CheckpointIO(prefix, codec.SharedCodec())
    assert opened == [] and io.restore(path, storage.STATE, {}) == {}  # made, nothing opened
    io.open()
    io.open()
    io.save_async(path, encoded, found)
    io.close()
    assert len(opened) == 1
    [restored] = io.restore(path, storage.STATE, _stored(path)).values()
    assert restored.tolist() == [0.0, 1.0, 2.0]
    io.close()
    assert len(opened) == 2


def test_a_local_tier_handle_passes_the_local_fail_points(tmp_path, monkeypatch):
    """A handle of the local tier fails at local.save.copy; the persistent one at save.copy."""
    prefix = str(tmp_path)
    found, encoded = _encoded(prefix, 0, {"w": jnp.arange(3.0)}, codec.SharedCodec())
    monkeypatch.setenv(faults.FAIL_AT_ENV, "local.save.copy:1")
    local = CheckpointIO(prefix, codec.SharedCodec(), tier="local")
    with local, pytest.raises(OSError, match="injected I/O error at the fail point 'local.save"):
        local.save_async(db_name(0, "local", prefix), encoded, found)
    with CheckpointIO(prefix, codec.SharedCodec()) as io:
        io.save_async(db_name(1, "local", prefix), encoded, found)  # not its fail point
    assert is_committed(db_name(1, "local", prefix))
