"""restore(sharding=...): a key path that matches nothing, at any depth, is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob

ONE = jax.sharding.SingleDeviceSharding(jax.devices()[0])


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """A db_prefix with epoch 0: params {w, b, layers: [{w}, {w}]}, opt, a step counter."""
    path = str(tmp_path_factory.mktemp("ckpt"))
    ckpt = jaxjob.CheckpointManager(path)
    layers = [{"w": jnp.full(2, i)} for i in range(2)]
    ckpt.save(0, {"params": {"w": jnp.ones(3), "b": jnp.zeros(2), "layers": layers}, "opt": {}})
    ckpt.close()
    return path


@pytest.mark.parametrize(
    "sharding, leaves, where, available",
    [
        ({"params": {"W": ONE}}, None, r"\['params'\]\['W'\]", r"\['b', 'layers', 'w'\]"),
        (
            {"params": {"layers": [{"w": ONE}, {"v": ONE}]}},
            None,
            r"\['params'\]\['layers'\]\[1\]\['v'\]",
            r"\['w'\]",
        ),
        (
            {"params": {"layers": [ONE, ONE, ONE]}},
            None,
            r"\['params'\]\['layers'\]\[2\]",
            r"\['0', '1'\]",
        ),
        ({"params": {"w": {"x": ONE}}}, None, r"\['params'\]\['w'\]\['x'\]", r"\[\] \(a leaf\)"),
        (
            {"params/layers/1": {"W": ONE}},
            ["params/layers/1"],
            r"\['params/layers/1'\]\['W'\]",
            r"\['w'\]",
        ),
    ],
    ids=["in-a-subtree", "two-deep-in-a-list", "past-a-list's-end", "under-a-leaf", "key-path"],
)
def test_a_sharding_key_that_matches_nothing_at_any_depth_raises(
    prefix, sharding, leaves, where, available
):
    """A misspelt key inside a subtree would leave those leaves on one device: KeyError naming
    the key path and the keys there are at that level."""
    with pytest.raises(
        KeyError, match=rf"sharding= key path {where} matches nothing .*{available}"
    ):
        jaxjob.restore(prefix, leaves=leaves, sharding=sharding)


@pytest.mark.parametrize(
    "sharding, leaves",
    [
        ({"params": {"w": ONE, "layers": ONE}}, None),  # a prefix of the subtree
        ({"params": {"layers": [{"w": ONE}, None]}}, None),  # None: the default device
        ({"params": {"b": ONE, "w": ONE}}, ["params/w"]),  # b exists, it is just not restored
        ({"params": ONE, "opt": {}}, None),
    ],
)
def test_sharding_keys_that_exist_are_accepted(prefix, sharding, leaves):
    """Key paths into the saved names (restored or not), prefixes and None: restored."""
    restored = jaxjob.restore(prefix, leaves=leaves, sharding=sharding)
    w = restored["params/w"] if leaves else restored["params"]["w"]
    np.testing.assert_array_equal(w, np.ones(3))
