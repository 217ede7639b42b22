"""The leaf codec: what a save refuses to flatten (keys that collide once stored)."""

import jax
import jax.numpy as jnp
import pytest

import jaxjob


@jax.tree_util.register_pytree_with_keys_class
class _TwoX:
    """A pytree node whose two children have keys that are both ``"x"`` once stored."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def tree_flatten_with_keys(self):
        keys = (jax.tree_util.GetAttrKey("x"), jax.tree_util.DictKey("x"))
        return tuple(zip(keys, (self.a, self.b), strict=True)), None

    def tree_flatten(self):
        return (self.a, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_a_save_whose_keys_collide_once_stored_is_refused(tmp_path):
    """A container whose keys would be one stored key is refused at save, not unreadable later."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    with pytest.raises(TypeError, match=r"the container at \['t'\]: its keys \['x'\] are the same"):
        ckpt.save(0, {"t": _TwoX(jnp.ones(1), jnp.zeros(1))})
    ckpt.close()
    assert not (tmp_path / "local.0").exists()
