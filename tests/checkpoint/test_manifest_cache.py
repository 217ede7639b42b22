"""The manifest cache: a save of the last structure reuses its layout byte for byte; others miss."""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxjob
from jaxjob._src.checkpoint import checksum, codec, manifest, storage
from jaxjob._src.checkpoint.manifest_cache import ManifestCache

Pair = collections.namedtuple("Pair", ["left", "right"])


def _workspace(scale=1, **changes):
    """Every kind of leaf and node: nested dicts, lists, tuples, None, custom nodes, int keys."""
    ws = {
        "params": {
            "w": jnp.arange(6.0).reshape(2, 3) * scale,
            "b": jnp.zeros(3, jnp.bfloat16) + scale,
            "layers": [{"k": np.ones((2, 2), ml_dtypes.bfloat16) * scale}, (np.int8(scale), None)],
        },
        "rng": jax.random.key(scale),
        "opt": Pair(np.arange(3, dtype=np.int32) * scale, {1: 0.5 * scale, 2: scale}),
        "ordered": collections.OrderedDict([("z", np.float32(scale)), ("a", True)]),
        "flags": {True: 3 * scale, False: [1.5, False]},
        "names": {"name/with.dots": scale, "Name/With.Dots": 1.0},
        "empty": ({}, [], ()),
    }
    return {**ws, **changes}


def _build(state, outputs=None, cache=None, epoch=3):
    """A manifest as a writer builds it with ``cache``, else as ``manifest.build`` does."""
    lineage = {"run": "0" * 32, "life": "1" * 32}
    if cache is None:
        found, flat = manifest.build(epoch, "n", state, outputs or {}, None, **lineage)
    else:
        layout, flat = cache.describe(state, outputs or {})
        found = manifest.assemble(
            layout, epoch, "n", None, tier="persistent", resumed_from=None, **lineage
        )
    return dataclasses.replace(found, time=0.0), flat


def _text(found):
    return json.dumps(found.to_json(), sort_keys=True)


def _hit(first, second):
    """Whether ``second`` reused ``first`` 's leaf specs (a cache hit)."""
    return first.leaves.keys() == second.leaves.keys() and all(
        second.leaves[n] is spec for n, spec in first.leaves.items()
    )


def test_a_save_of_the_same_structure_reuses_the_layout_and_writes_the_same_bytes():
    """Other values, same structure: the specs are reused and to_json is the fresh build's."""
    cache = ManifestCache()
    outputs = {"loss": np.float32(0.5)}
    first, _ = _build(_workspace(1), outputs, cache, epoch=1)
    ws, outputs = _workspace(2), {"loss": np.float32(0.25)}
    second, flat = _build(ws, outputs, cache, epoch=2)
    fresh, fresh_flat = _build(ws, outputs, epoch=2)
    assert _hit(first, second)
    assert _text(second) == _text(fresh)
    for found in (first, second, fresh):
        doc = found.to_json()
        assert doc[checksum.SELF_KEY] == checksum.doc_checksum(doc)
    assert second.to_json()["epoch"] == 2 and second.life == "1" * 32
    assert list(flat["state"]) == list(fresh_flat["state"])
    assert all(flat["state"][n] is v for n, v in fresh_flat["state"].items())
    assert flat["outputs"]["loss"] == np.float32(0.25)


def test_a_name_like_the_leaves_mark_still_gets_the_documents_checksum():
    """The self checksum is the document's even when a name is the text the leaves are put at."""
    ws = {manifest._LEAVES: 1.0, "x": {manifest._LEAVES: np.ones(2)}}
    cache = ManifestCache()
    for _ in range(2):
        doc = _build(ws, cache=cache)[0].to_json()
        assert doc[checksum.SELF_KEY] == checksum.doc_checksum(doc)


def test_each_manifest_has_its_own_dicts():
    """A cached manifest's state, outputs and leaves dicts are not shared with the last one."""
    cache = ManifestCache()
    first, _ = _build(_workspace(), cache=cache)
    second, _ = _build(_workspace(), cache=cache)
    assert first.state is not second.state and first.leaves is not second.leaves
    assert first.leaves["rng"].to_json() is not second.leaves["rng"].to_json()


MISSES = {
    "shape": {"params": {**_workspace()["params"], "w": jnp.ones((3, 2))}},
    "dtype": {"rng": jax.random.key(1, impl="rbg")},
    "numpy dtype": {"opt": Pair(np.arange(3, dtype=np.int64), {1: 0.5, 2: 1})},
    "numpy to jax": {"opt": Pair(jnp.arange(3, dtype=jnp.int32), {1: 0.5, 2: 1})},
    "int to float": {"opt": Pair(np.arange(3, dtype=np.int32), {1: 0.5, 2: 1.0})},
    "bool to int": {"ordered": collections.OrderedDict([("z", np.float32(1)), ("a", 1)])},
    "numpy scalar to array": {"ordered": collections.OrderedDict([("z", np.ones(1)), ("a", True)])},
    "key order": {"ordered": collections.OrderedDict([("a", True), ("z", np.float32(1))])},
    "int key to bool key": {"opt": Pair(np.arange(3, dtype=np.int32), {True: 0.5, 2: 1})},
    "bool key to int key": {"flags": {1: 3, 0: [1.5, False]}},
    "numpy key": {"opt": Pair(np.arange(3, dtype=np.int32), {np.int64(1): 0.5, 2: 1})},
    "tuple to list": {"empty": ({}, [], [])},
    "None to empty tuple": {"params": {**_workspace()["params"], "layers": [{}, (1, ())]}},
    "new leaf": {"extra": 1},
    "removed leaf": {"flags": {True: 3}},
    "renamed key": {"names": {"name/with_dots": 1, "Name/With.Dots": 1.0}},
    "namedtuple to tuple": {"opt": (np.arange(3, dtype=np.int32), {1: 0.5, 2: 1})},
}


@pytest.mark.parametrize("case", sorted(MISSES))
def test_another_structure_misses_and_is_built_afresh(case):
    """A change of shape, dtype, kind, key (its type, name or order) or leaves misses the cache."""
    cache = ManifestCache()
    first, _ = _build(_workspace(), cache=cache)
    changed = _workspace(**MISSES[case])
    second, _ = _build(changed, cache=cache)
    assert not _hit(first, second)
    assert _text(second) == _text(_build(changed)[0])
    third, _ = _build(changed, cache=cache)  # now the last structure: a hit
    assert _hit(second, third)


def test_plain_dict_key_order_is_the_same_structure():
    """A dict's keys are sorted by JAX: another insertion order hits and writes the same bytes."""
    cache = ManifestCache()
    first, _ = _build({"d": {"a": 1, "b": np.ones(2)}}, cache=cache)
    second, flat = _build({"d": {"b": np.zeros(2), "a": 2}}, cache=cache)
    assert _hit(first, second)
    assert _text(second) == _text(_build({"d": {"b": np.zeros(2), "a": 2}})[0])
    assert flat["state"]["d/a"] == 2


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (2**70, r"Python int at \['x'\]\['v'\]"),
        (np.array([None], dtype=object), r"leaf at \['x'\]\['v'\] of type ndarray"),
        (object(), r"leaf at \['x'\]\['v'\] of type object"),
        ("text", r"leaf at \['x'\]\['v'\] of type str"),
    ],
)
def test_a_leaf_gone_bad_under_the_same_structure_is_refused_every_time(bad, match):
    """A bad leaf where the cached structure had a good one raises, by key path, on each save."""
    cache = ManifestCache()
    good = np.ones(1) if isinstance(bad, np.ndarray) else 1
    _build({"x": {"v": good}}, cache=cache)
    for _ in range(2):
        with pytest.raises(jaxjob.UnstorableLeafError, match=match):
            _build({"x": {"v": bad}}, cache=cache)
    first, _ = _build({"x": {"v": good}}, cache=cache)
    assert _hit(first, _build({"x": {"v": good}}, cache=cache)[0])


def test_a_zero_size_array_after_a_cached_save_is_refused_by_the_encoder():
    """The encoder's checks still run on every save: a zero-size array is refused, by key path."""
    cache = ManifestCache()
    _build({"x": jnp.ones(2)}, cache=cache)
    found, flat = _build({"x": jnp.ones(0)}, cache=cache)
    with pytest.raises(jaxjob.UnstorableLeafError, match=r"at \['x'\].*zero-size"):
        storage.encode(found, flat, codec.SharedCodec())


def test_a_manager_writes_the_manifest_a_fresh_build_gives(tmp_path):
    """Through CheckpointManager: epochs of one structure, then another, read back as built."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    spaces = [_workspace(1), _workspace(2), _workspace(3, extra=np.ones(2))]
    for epoch, ws in enumerate(spaces):
        ckpt.save(epoch, ws)
    ckpt.close()
    for epoch, ws in enumerate(spaces):
        read = manifest.read(os.path.join(str(tmp_path), f"local.{epoch}"))
        fresh, _ = _build(jaxjob.Workspace(ws), epoch=epoch)  # as the manager: names sorted
        same = {f: getattr(read, f) for f in ("node", "time", "life", "run", "metrics")}
        assert _text(dataclasses.replace(fresh, **same)) == _text(read)
    with pytest.raises(jaxjob.UnstorableLeafError, match=r"\['opt'\]\.right\[2\]"):
        jaxjob.CheckpointManager(str(tmp_path)).save(
            9, _workspace(1, opt=Pair(1, {1: 0, 2: 2**64}))
        )


SHARDED = """
import dataclasses, json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxjob._src.checkpoint import manifest
from jaxjob._src.checkpoint.manifest_cache import ManifestCache

assert jax.device_count() == 4
mesh = jax.make_mesh((2, 2), ("x", "y"))
def put(x, *spec):
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))
def ws(scale, **changes):
    return {
        "w": put(jnp.ones((4, 4)) * scale, "x", "y"),
        "v": put(jnp.arange(8.0) * scale, "x"),
        "r": put(jnp.zeros(2, jnp.bfloat16), None),
        "one": jax.device_put(jnp.ones(2) * scale, jax.devices()[2]),
        "key": jax.random.split(jax.random.key(scale), 4),
        "n": np.ones(3) * scale,
        **changes,
    }
def build(state, cache=None):
    lineage = {"run": "0" * 32, "life": "1" * 32}
    if cache is None:
        found, _ = manifest.build(1, "n", state, {}, None, **lineage)
    else:
        found = manifest.assemble(cache.describe(state, {})[0], 1, "n", None,
                                  tier="persistent", resumed_from=None, **lineage)
    return dataclasses.replace(found, time=0.0)
def text(found):
    return json.dumps(found.to_json(), sort_keys=True)
def hit(a, b):
    return a.leaves.keys() == b.leaves.keys() and all(b.leaves[n] is s for n, s in a.leaves.items())

cache = ManifestCache()
first = build(ws(1), cache)
second = build(ws(2), cache)
assert hit(first, second) and text(second) == text(build(ws(2))), "same structure"
assert second.leaves["one"].device == 2
misses = {
    "spec": {"w": put(jnp.ones((4, 4)), "y", "x")},
    "replicated": {"v": put(jnp.arange(8.0), None)},
    "device": {"one": jax.device_put(jnp.ones(2), jax.devices()[1])},
    "mesh": {"w": jax.device_put(jnp.ones((4, 4)), NamedSharding(
        jax.make_mesh((4, 1), ("x", "y")), P("x", "y")))},
}
kinds = jax.devices()[0].addressable_memories()
if any(m.kind == "pinned_host" for m in kinds):
    misses["memory kind"] = {"v": jax.device_put(jnp.arange(8.0), NamedSharding(
        mesh, P("x"), memory_kind="pinned_host"))}
for case, change in misses.items():
    cache = ManifestCache()
    first = build(ws(1), cache)
    changed = build(ws(1, **change), cache)
    assert not hit(first, changed), case
    assert text(changed) == text(build(ws(1, **change))), case
print("ok", sorted(misses))
"""


def test_sharded_leaves_hit_on_the_same_shardings_and_miss_on_others(tmp_path):
    """Over 4 devices: same shardings reuse the layout; other specs, meshes, devices miss."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SHARDED)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok" in proc.stdout
