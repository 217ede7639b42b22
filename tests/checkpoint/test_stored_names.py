"""Stored names: escaped key paths, unique whatever the keys, readable by plain Orbax."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import jaxjob
from jaxjob._src.checkpoint import keypaths, manifest, stored_names


@jax.tree_util.register_pytree_with_keys_class
class _IntAndStr:
    """A pytree node whose children have the keys ``0`` (int) and ``"0"`` (str)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def tree_flatten_with_keys(self):
        keys = (jax.tree_util.DictKey(0), jax.tree_util.DictKey("0"))
        return tuple(zip(keys, (self.a, self.b), strict=True)), None

    def tree_flatten(self):
        return (self.a, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def _names(tree):
    """``(key path, stored name)`` of every leaf of a workspace, as a save names them."""
    found, _ = manifest.build(0, "local", tree, {}, None, run="0" * 32)
    return [
        (keypaths.join((name, *segments)), stored)
        for name, structure in found.state.items()
        for segments, stored in keypaths.leaf_names(structure)
    ]


@pytest.mark.parametrize(
    ("part", "escaped"),
    [
        ("kernel", "kernel"),
        ("Dense_0", "Dense_0"),
        ("a.b-c", "a.b-c"),
        (3, "3"),
        (True, "True"),
        ("a/b", "a%2Fb"),
        ("50%", "50%25"),
        ("x y", "x%20y"),
        ("π", "%CF%80"),
        ("~1", "%7E1"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("." * 50, "%2E" * 40),  # cut like any part (check() refused 150 characters)
        ("", "~"),
        ("a" * 500, "a" * stored_names.MAX_PART),
        ("é" * 100, "%C3%A9" * 20),  # cut before an escape, never inside one
    ],
)
def test_a_key_becomes_one_escaped_part(part, escaped):
    """Bytes outside A-Za-z0-9_-. are %XX; dot-only parts escaped, an empty key ~, long ones cut."""
    assert stored_names.escape(str(part)) == escaped
    stored_names.check(escaped)


def test_stored_names_are_the_key_paths_that_show_prints():
    """Model and optimizer leaves, list indices, int keys and /-names keep their key paths."""
    params = {"layers": [{"w": jnp.ones(2)}, {"w": jnp.ones(2)}], "emb": jnp.ones(3)}
    tree = {
        "params": params,
        "opt_state": optax.adam(1e-3).init(params),
        "table": {0: jnp.zeros(1), 7: jnp.zeros(1)},
        "jaxjob/epochs_done": 3,
        "rng": jax.random.key(0),
    }
    names = dict(_names(tree))
    assert all(stored == path for path, stored in names.items()), names
    assert "opt_state/0/mu/layers/1/w" in names and "table/7" in names
    assert "jaxjob/epochs_done" in names and "opt_state/0/count" in names


CLASHES = {
    "a name with / beside a nested key": (
        {"a/b": jnp.ones(1), "a": {"b": jnp.zeros(1)}},
        {"a/b": "a/b", "a/b~1": "a/b"},
    ),
    "a key with / beside a nested key": (
        {"p": {"a/b": jnp.ones(1), "a": {"b": jnp.zeros(1)}}},
        {"p/a/b": "p/a/b", "p/a%2Fb": "p/a/b"},
    ),
    "int and str keys": (
        {"t": _IntAndStr(jnp.ones(1), jnp.zeros(1))},
        {"t/0": "t/0", "t/0~1": "t/0"},
    ),
    "keys differing in case": (
        {"p": {"W": jnp.ones(1), "w": jnp.zeros(1)}},
        {"p/W": 0, "p/w~1": 0},
    ),
    "a leaf where another is a directory": (
        {"lst": [jnp.ones(1)], "lst/0": {"x": jnp.zeros(1)}},
        {"lst/0": 0, "lst/0~1/x": 0},
    ),
    "a name Orbax writes beside the arrays": (
        {"_METADATA": jnp.ones(1), "_sharding": {"x": jnp.zeros(1)}},
        {"_METADATA~1": 0, "_sharding~1/x": 0},
    ),
    "dot and empty keys": ({"d": {".": jnp.ones(1), "": jnp.zeros(1)}}, {"d/%2E": 0, "d/~": 0}),
    "long dot-only keys": (
        {"d": {"." * 50: jnp.ones(1), "." * 60: jnp.zeros(1)}},
        {"d/" + "%2E" * 40: 0, "d/" + "%2E" * 40 + "~1": 0},
    ),
}


@pytest.mark.parametrize("case", sorted(CLASHES))
def test_leaves_whose_key_paths_clash_get_distinct_names_and_round_trip(tmp_path, case):
    """No two leaves share a name, differ only in case, or nest; each restores to its own key."""
    tree, expected = CLASHES[case]
    names = [stored for _, stored in _names(tree)]
    assert sorted(names) == sorted(expected), names
    stored_names.check_disjoint(names)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, tree)
    ckpt.close()
    back = jaxjob.restore(tmp_path)
    if case == "int and str keys":  # a custom node comes back as a dict of its keys
        assert back["t"][0].tolist() == [1.0] and back["t"]["0"].tolist() == [0.0]
        return
    assert jax.tree.structure(dict(back)) == jax.tree.structure(tree)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), dict(back), tree))


def test_long_and_deep_key_paths_are_cut_and_stay_distinct(tmp_path):
    """Keys past MAX_PART and paths past MAX_NAME are cut (at a /); cut names still differ."""
    deep = jnp.ones(1)
    for i in range(30):
        deep = {"k" * 60 + str(i % 2): deep}
    tree = {"long": {"x" * 300 + "1": jnp.ones(1), "x" * 300 + "2": jnp.zeros(1)}, "deep": deep}
    names = [stored for _, stored in _names(tree)]
    assert len(set(names)) == 3 and all(len(n) <= stored_names.MAX_NAME + 3 for n in names)
    assert all(len(p) <= stored_names.MAX_PART + 2 for n in names for p in n.split("/"))
    stored_names.check_disjoint(names)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, tree)
    ckpt.close()
    back = jaxjob.restore(tmp_path)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), dict(back), tree))


def test_orbax_without_ocdbt_stores_the_names_as_directories(tmp_path):
    """Names that clash as paths, written the way a one-process checkpoint is (no OCDBT), read back.

    Without OCDBT every stored name is a directory of zarr files: escaped and
    deduplicated names never reach outside the item or into another leaf.
    """
    tree = {key: value for case in CLASHES.values() for key, value in case[0].items()}
    tree.pop("t")  # not flattened alone by JAX beside str keys; covered above
    found, flat = manifest.build(0, "local", tree, {}, None, run="0" * 32)
    arrays = {name: np.asarray(leaf) for name, leaf in flat["state"].items()}
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False)
    with ocp.Checkpointer(handler) as saver:
        saver.save(tmp_path / "state", args=ocp.args.PyTreeSave(arrays))
    restored = ocp.PyTreeCheckpointer().restore(tmp_path / "state")
    assert sorted(restored) == sorted(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(restored[name], value)
    files = [
        os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs
    ]
    assert all(f.startswith("state/") for f in files)


def test_plain_orbax_restores_the_state_item_by_key_path(tmp_path):
    """``ocp.StandardCheckpointer().restore(<checkpoint>/state)`` is keyed by key path."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    tree = {"params": {"w": jnp.arange(3, dtype=jnp.bfloat16)}, "rng": jax.random.key(3)}
    ckpt.save(2, tree)
    ckpt.close()
    flat = ocp.StandardCheckpointer().restore(os.path.abspath(tmp_path / "local.2" / "state"))
    assert sorted(flat) == ["params/w", "rng"]
    assert flat["params/w"].dtype == jnp.bfloat16 and flat["params/w"].tolist() == [0, 1, 2]
    assert (jax.random.key_data(flat["rng"]) == jax.random.key_data(tree["rng"])).all()
    with open(tmp_path / "local.2" / "jaxjob" / "manifest.json") as f:
        doc = json.load(f)
    assert doc["format"] == manifest.FORMAT == 8
    assert {e["name"]: e["path"] for e in doc["leaves"]} == {
        "params/w": "['params']['w']",
        "rng": "['rng']",
    }
