"""The manifest: crafted documents are corrupt, named by field; copied directories are refused."""

import copy
import json
import os
import shutil

import damage
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob
from jaxjob._src.checkpoint import checksum, manifest, schema, verify


def _workspace(scale):
    return {
        "w": jnp.arange(6.0).reshape(2, 3) * scale,
        "key": jax.random.key(scale),
        "n": np.arange(4, dtype=np.int32) * scale,
        "s": np.float32(2.5 * scale),
        "i": 7 * scale,
        "layers": {0: (jnp.ones(2) * scale, None), 1: [np.int8(scale)]},
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A db_prefix with committed epochs 0 and 1 of every kind of leaf."""
    return damage.save_epochs(tmp_path_factory.mktemp("saved"), lambda e: _workspace(e + 1))


@pytest.fixture(scope="module")
def doc(saved):
    """The manifest document of epoch 0."""
    with open(_file(os.path.join(saved, "local.0"))) as f:
        return json.load(f)


def _file(path):
    return os.path.join(path, manifest.MANIFEST_ITEM, manifest.MANIFEST_FILE)


def _write(path, doc, *, resign=True):
    """Writes ``doc`` as the manifest under ``path``, its checksum fixed to match (as a forger)."""
    if resign:
        doc[checksum.SELF_KEY] = checksum.doc_checksum(doc)
    os.makedirs(os.path.dirname(_file(path)), exist_ok=True)
    with open(_file(path), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))


def _leaf(doc, path):
    """The leaf entry of key path ``path`` (``"['w']"``)."""
    (entry,) = [e for e in doc["leaves"] if e["path"] == path]
    return entry


def _set(*keys_and_value):
    """An edit setting ``doc[k1][k2]... = value``."""
    *keys, value = keys_and_value

    def edit(doc):
        target = doc
        for key in keys[:-1]:
            target = _leaf(doc, key) if key.startswith("[") else target[key]
        target[keys[-1]] = value

    return edit


def _nested(depth):
    node = {"leaf": "l0"}
    for _ in range(depth):
        node = {"list": [node]}
    return node


def _rename_leaf(path, name):
    """An edit renaming the stored leaf at key path ``path`` (``"['w']"``) everywhere."""

    def edit(doc):
        entry = _leaf(doc, path)
        key = path[2:-2]
        assert doc["state"][key] == {"leaf": entry["name"]}
        doc["state"][key], entry["name"] = {"leaf": name}, name

    return edit


def _swap_leaf_reference(doc):
    """``w`` references the leaf of ``n`` too: one leaf twice, another none."""
    doc["state"]["w"] = doc["state"]["n"]


FIELDS = sorted(schema.FIELDS - {"format", checksum.SELF_KEY})
# Case -> (edit of the document, what the error says). Each edited document is re-signed.
CRAFTED = {
    **{
        f"{field} removed": (lambda d, f=field: d.pop(f), rf"lacks \['{field}'\]")
        for field in FIELDS
    },
    **{
        f"{field} null": (_set(field, None), rf"{field} is null")
        for field in FIELDS
        if field not in ("owner_process", "resumed_from")  # null: no process, from scratch
    },
    "life not hex": (_set("life", "not-a-life"), r'life is "not-a-life", expected 32 hex digits'),
    "life a number": (_set("life", 5), r"life is 5"),
    "resumed_from negative": (_set("resumed_from", -1), r"resumed_from is -1, expected null or"),
    "resumed_from a float": (_set("resumed_from", 1.0), r"resumed_from is 1.0"),
    "resumed_from a string": (_set("resumed_from", "3"), r'resumed_from is "3"'),
    "unknown field": (_set("module", "os"), r"has unknown \['module'\]"),
    "epoch a string": (_set("epoch", "0"), r'epoch is "0", expected an int >= 0'),
    "epoch a float": (_set("epoch", 0.0), r"epoch is 0.0"),
    "epoch a bool": (_set("epoch", False), r"epoch is false"),
    "epoch negative": (_set("epoch", -1), r"epoch is -1"),
    "epoch past int64": (_set("epoch", 2**63), r"epoch is 9223372036854775808"),
    "node empty": (_set("node", ""), r'node is "", expected a plain directory name'),
    "node a path": (_set("node", "../x"), r'node is "../x"'),
    "node not a string": (_set("node", 5), r"node is 5"),
    "process_count zero": (_set("process_count", 0), r"process_count is 0, expected an int in"),
    "process_count a float": (_set("process_count", 1.0), r"process_count is 1.0"),
    "process_count huge": (_set("process_count", 10**9), r"process_count is 1000000000"),
    "owner_process past the count": (_set("owner_process", 1), r"owner_process is 1, expected"),
    "owner_process negative": (_set("owner_process", -1), r"owner_process is -1"),
    "owner_process a bool": (_set("owner_process", True), r"owner_process is true"),
    "time a string": (_set("time", "now"), r'time is "now", expected a finite number'),
    "time NaN": (_set("time", float("nan")), r"time is NaN"),
    "time infinite": (_set("time", float("inf")), r"time is Infinity"),
    "time past any float": (_set("time", 10**400), r"time is 1000000000"),
    "run not hex": (_set("run", "not-a-run"), r'run is "not-a-run", expected 32 hex digits'),
    "run a number": (_set("run", 5), r"run is 5"),
    "devices a list": (_set("devices", []), r"devices is \[\], expected \{\"platform\""),
    "devices without memory kinds": (
        _set("devices", {"platform": "cpu", "count": 1}),
        r"devices is .*expected .*memory_kinds",
    ),
    "devices count zero": (
        _set("devices", {"platform": "cpu", "count": 0, "memory_kinds": []}),
        r"devices is .*\"count\": 0.*expected",
    ),
    "devices platform a path": (
        _set("devices", {"platform": "../x", "count": 1, "memory_kinds": []}),
        r"devices is .*\.\./x.*expected",
    ),
    "devices memory kinds unsorted": (
        _set("devices", {"platform": "cpu", "count": 1, "memory_kinds": ["z", "a"]}),
        r"devices is .*expected .*a sorted list",
    ),
    "state a list": (_set("state", []), r"state is \[\], expected an object"),
    "state references an unknown leaf": (
        _set("state", "w", {"leaf": "l99"}),
        r"reference \['l99'\], which leaves lacks",
    ),
    "state references a leaf twice": (_swap_leaf_reference, r"more than once"),
    "state node with an extra key": (
        _set("state", "w", {"leaf": "l0", "module": "os"}),
        r"state\['w'\] is .*expected a tree node",
    ),
    "state variable type not a string": (
        _set("state", "w", {"dict": [["value", {"leaf": "l0"}]], "variable": {"x": 1}}),
        r"state\['w'\] is .*expected a tree node",
    ),
    "state variable type on a leaf": (
        _set("state", "w", {"leaf": "l0", "variable": "Param"}),
        r"state\['w'\] is .*expected a tree node",
    ),
    "state leaf not a stored name": (
        _set("state", "w", {"leaf": "../../x"}),
        r"state\['w'\] is .*expected a tree node",
    ),
    "state dict entry not a pair": (
        _set("state", "w", {"dict": [["a"]]}),
        r"an entry of state\['w'\] is \[\"a\"\], expected a \[key, tree node\] pair",
    ),
    "state dict key twice": (
        _set("state", "w", {"dict": [["a", {"none": True}], ["a", {"none": True}]]}),
        r"a key of state\['w'\] is \"a\", expected each key once",
    ),
    "state dict key neither str nor int": (
        _set("state", "w", {"dict": [[{"float": 1.5}, {"none": True}]]}),
        r"a key of state\['w'\] is \{\"float\": 1.5\}",
    ),
    "state int key a float": (
        _set("state", "w", {"dict": [[{"int": 1.0}, {"none": True}]]}),
        r"a key of state\['w'\]",
    ),
    "state none not true": (_set("state", "w", {"none": 1}), r"state\['w'\] is \{\"none\": 1\}"),
    "state nested too deep": (
        _set("state", "w", _nested(300)),
        r"state\['w'\][\[\]0]+\.\.\. is nested deeper than 256 containers",
    ),
    "state name unsafe": (
        lambda d: d["state"].update({"../x": d["state"].pop("w")}),
        r"workspace name '../x' cannot be checkpointed",
    ),
    "outputs a string": (_set("outputs", "x"), r'outputs is "x", expected an object'),
    "leaves an object": (_set("leaves", {}), r"leaves is \{\}, expected a list"),
    "leaves empty": (_set("leaves", []), r"which leaves lacks"),
    "a leaf twice": (lambda d: d["leaves"].append(d["leaves"][0]), r"leaves describes .* more"),
    "a leaf no structure holds": (
        lambda d: d["leaves"].append({**d["leaves"][0], "name": "l99"}),
        r"leaves describes \['l99'\], which neither state nor outputs holds",
    ),
    "leaf entry not an object": (_set("leaves", 0, "l0"), r"leaves\[0\]: invalid leaf entry"),
    "leaf entry with an extra key": (
        _set("['w']", "module", "os"),
        r"invalid leaf entry 'w' at \['w'\]: the entry has unknown \['module'\]",
    ),
    "leaf entry without nbytes": (
        lambda d: _leaf(d, "['n']").pop("nbytes"),
        r"at \['n'\]: the entry lacks \['nbytes'\]",
    ),
    "leaf entry without device": (
        lambda d: _leaf(d, "['w']").pop("device"),
        r"at \['w'\]: the entry lacks \['device'\]",
    ),
    "leaf device negative": (_set("['w']", "device", -1), r"device is -1, expected null, or"),
    "leaf device a string": (_set("['w']", "device", "cpu:0"), r'device is "cpu:0", expected'),
    "leaf device on a numpy leaf": (
        _set("['n']", "device", 0),
        r"at \['n'\]: device is 0, expected null, or for a jax or prng_key leaf an int",
    ),
    "leaf name not a stored name": (
        _set("['w']", "name", "../x"),
        r'name is "../x", expected a stored name: /-joined parts',
    ),
    "leaf name with a dot-dot part": (_set("['w']", "name", "a/../b"), r'name is "a/../b"'),
    "leaf name unescaped": (_set("['w']", "name", "a b"), r'name is "a b"'),
    "leaf name a directory of another": (
        _rename_leaf("['w']", "n/x"),
        r"stored name 'n' is a directory of stored name 'n/x'",
    ),
    "leaf name a file Orbax writes": (
        _rename_leaf("['w']", "_METADATA"),
        r"stored name '_METADATA' starts with a file Orbax writes",
    ),
    "leaf path not a string": (_set("['w']", "path", 5), r"path is 5, expected a key path"),
    "leaf kind unknown": (_set("['w']", "kind", "pickle"), r'kind is "pickle", expected one of'),
    "jax dtype a module name": (
        _set("['w']", "dtype", "crafted_payload.Evil"),
        r"at \['w'\]: dtype 'crafted_payload.Evil' is not one a jax leaf can have \(allowed: b",
    ),
    "jax dtype object": (_set("['w']", "dtype", "object"), r"dtype 'object' is not one"),
    "jax dtype TensorStore lacks": (
        _set("['w']", "dtype", "uint4"),
        r"at \['w'\]: dtype is \"uint4\", expected a dtype that Orbax",
    ),
    "jax dtype not a string": (_set("['w']", "dtype", 32), r"dtype 32 is not a dtype name"),
    "numpy dtype structured": (_set("['n']", "dtype", "i4,f8"), r"at \['n'\]: dtype 'i4,f8'"),
    "numpy dtype sub-array": (_set("['n']", "dtype", "(2,)i4"), r"dtype '\(2,\)i4'"),
    "numpy dtype object": (_set("['n']", "dtype", "O"), r"dtype 'O' is not one a numpy leaf"),
    "numpy dtype not canonical": (_set("['n']", "dtype", "i4"), r"dtype 'i4' is not one"),
    "numpy dtype reinterpreting its bytes": (
        _set("['n']", "dtype", "float64"),
        r"at \['n'\]: nbytes is 16, expected 32, the bytes of float64 of shape \(4,\)",
    ),
    "python dtype not a Python scalar type": (
        _set("['i']", "dtype", "float32"),
        r"at \['i'\]: dtype 'float32' is not one a python leaf",
    ),
    "python leaf with a shape": (
        _set("['i']", "shape", [2]),
        r"at \['i'\]: shape is \[2\], expected \[\] for a python leaf",
    ),
    "numpy scalar with a shape": (_set("['s']", "shape", [1]), r"expected \[\] for a numpy_scalar"),
    "key dtype of another impl": (
        _set("['key']", "dtype", "key<rbg>"),
        r"dtype 'key<rbg>' is not that of threefry2x32 keys",
    ),
    "key impl unknown": (_set("['key']", "impl", "os:system"), r"implementation 'os:system'"),
    "impl on a plain leaf": (_set("['w']", "impl", "rbg"), r"impl 'rbg' is given for a leaf"),
    "shape negative": (_set("['w']", "shape", [-2, 3]), r"shape is \[-2, 3\], expected a list"),
    "shape a float": (_set("['w']", "shape", [2.0, 3]), r"shape is \[2.0, 3\]"),
    "shape a string": (_set("['w']", "shape", "23"), r'shape is "23"'),
    "shape of bools": (_set("['w']", "shape", [True, 3]), r"shape is \[true, 3\]"),
    "shape too many dims": (_set("['w']", "shape", [1] * 65), r"at most 64 ints"),
    "shape huge": (_set("['w']", "shape", [2**40] * 3), r"expected at most 1152921504606846976"),
    "shape empty for a jax leaf": (_set("['w']", "shape", [0, 3]), r"Orbax stores no zero-size"),
    "nbytes on a jax leaf": (_set("['w']", "nbytes", 24), r"nbytes is 24, expected null"),
    "nbytes null on a numpy leaf": (_set("['n']", "nbytes", None), r"nbytes is null, expected 16"),
    "nbytes a float": (_set("['n']", "nbytes", 16.0), r"nbytes is 16.0, expected 16"),
    "metrics a list": (_set("metrics", []), r"metrics is \[\], expected an object"),
    "metric a string": (_set("metrics", {"loss": "1"}), r"metrics\['loss'\] is \"1\""),
    "metric NaN": (_set("metrics", {"loss": float("nan")}), r"metrics\['loss'\] is NaN"),
    "metric a bool": (_set("metrics", {"loss": True}), r"metrics\['loss'\] is true"),
    "checksums empty": (_set("checksums", {}), r"checksums is \{\}, expected"),
    "checksums naming no file": (_set("checksums", "files", []), r"checksums is .*\"files\": \[\]"),
    "checksums of another process": (
        _set("checksums", "files", ["checksums.1.json"]),
        r"checksums is .*checksums.1.json",
    ),
    "checksums file outside": (_set("checksums", "files", ["../../x.json"]), r"checksums is"),
    "checksums of another algorithm": (_set("checksums", "algorithm", "none"), r"checksums is"),
    "checksums with an extra key": (_set("checksums", "verify", False), r"checksums is"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_manifest_is_corrupt_naming_the_file_and_field(doc, tmp_path, case):
    """Each field removed, nulled, mistyped or out of range: corrupt, naming the file and field."""
    edit, match = CRAFTED[case]
    crafted = copy.deepcopy(doc)
    edit(crafted)
    path = str(tmp_path / "local.0")
    _write(path, crafted)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=match) as info:
        manifest.read(path)
    message = str(info.value)
    assert f"epoch 0 at {path!r} is corrupt: the manifest {_file(path)!r} is malformed" in message
    assert "edited or written by another tool" in message


def test_the_untouched_document_reads(doc, tmp_path):
    """The matrix's base: the saved document, re-signed, reads (so each case tests one field)."""
    path = str(tmp_path / "local.0")
    _write(path, copy.deepcopy(doc))
    found = manifest.read(path)
    assert (found.epoch, found.node, found.run) == (0, "local", doc["run"])
    assert found.leaves[_leaf(doc, "['n']")["name"]].nbytes == 16


SELF_AND_FORMAT = {
    "self_checksum removed": (lambda d: d.pop(checksum.SELF_KEY), r"has no self_checksum"),
    "self_checksum wrong": (_set(checksum.SELF_KEY, 1), r"fails its checksum"),
    "self_checksum a string": (_set(checksum.SELF_KEY, "ok"), r"fails its checksum"),
    "self_checksum null": (_set(checksum.SELF_KEY, None), r"fails its checksum"),
    "an edit, not re-signed": (_set("epoch", 1), r"fails its checksum"),
    "checksums null, not re-signed": (_set("checksums", None), r"fails its checksum"),
    "format removed": (lambda d: d.pop("format"), r"has no format version"),
    "format a string": (_set("format", "4"), r"has no format version"),
    "format a float": (_set("format", 4.0), r"has no format version"),
    "format a bool": (_set("format", True), r"has no format version"),
}


@pytest.mark.parametrize("case", sorted(SELF_AND_FORMAT))
def test_a_manifest_without_a_valid_self_checksum_or_format_is_corrupt(doc, tmp_path, case):
    """Own checksum removed, wrong or of another type, or no format: corrupt, never unchecked."""
    edit, match = SELF_AND_FORMAT[case]
    crafted = copy.deepcopy(doc)
    edit(crafted)
    path = str(tmp_path / "local.0")
    _write(path, crafted, resign=False)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=match) as info:
        manifest.read(path)
    assert _file(path) in str(info.value)


@pytest.mark.parametrize(
    "text, match",
    [
        ("[1, 2]", r"has no format version"),
        ("[" * 100_000, r"is not valid JSON"),
        ('{"format": 4', r"is not valid JSON"),
        ('{"format": 5, "epoch": ' + "9" * 5000 + "}", r"is not valid JSON"),
    ],
)
def test_a_manifest_that_is_not_an_object_is_corrupt(tmp_path, text, match):
    """A JSON list, JSON nested past the parser's depth or cut short: corrupt, naming the file."""
    path = str(tmp_path / "local.0")
    _write(path, text, resign=False)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=match):
        manifest.read(path)


@pytest.mark.parametrize(
    "found, match",
    [
        (6, r"has checkpoint format 6; this jaxjob reads format 8 \(write it again with this"),
        (5, r"has checkpoint format 5; this jaxjob reads format 8 \(write it again with this"),
        (1, r"has checkpoint format 1; this jaxjob reads format 8 \(write it again"),
        (9, r"has checkpoint format 9; this jaxjob reads format 8 \(it was written by a newer"),
    ],
)
def test_another_format_is_refused_naming_both(doc, tmp_path, found, match):
    """Format 3 (or a newer one) is a ValueError naming both formats, not corruption."""
    path = str(tmp_path / "local.0")
    _write(path, {**copy.deepcopy(doc), "format": found})
    with pytest.raises(ValueError, match=match) as info:
        manifest.read(path)
    assert not isinstance(info.value, jaxjob.CorruptCheckpointError)


def test_a_format_7_manifest_reads_without_a_lineage(doc, tmp_path):
    """A format-7 document (no life, no resumed_from) reads, both None; with them it is corrupt."""
    old = {k: v for k, v in copy.deepcopy(doc).items() if k not in schema.LINEAGE}
    path = str(tmp_path / "local.0")
    _write(path, {**old, "format": 7})
    found = manifest.read(path)
    assert (found.life, found.resumed_from, found.run) == (None, None, doc["run"])
    _write(path, {**copy.deepcopy(doc), "format": 7})
    with pytest.raises(jaxjob.CorruptCheckpointError, match=r"has unknown \['life', 'resume"):
        manifest.read(path)


def test_every_save_records_a_life_and_no_resume(saved):
    """A manager's saves (no runner) record one life of its own and no resumed epoch."""
    found = [manifest.read(os.path.join(saved, f"local.{e}")) for e in (0, 1)]
    assert found[0].life == found[1].life and schema.RUN_ID.fullmatch(found[0].life)
    assert found[0].resumed_from is None


@pytest.mark.parametrize("offset", [0, 40, -20])
def test_a_byte_of_the_manifest_that_is_not_utf8_is_corrupt_naming_the_file(
    saved, tmp_path, offset
):
    """A flipped byte making the manifest invalid UTF-8: corrupt, naming the manifest file."""
    prefix = _copy_prefix(saved, tmp_path)
    path = os.path.join(prefix, "local.0")
    with open(_file(path), "r+b") as f:
        f.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] | 0x80]))  # a lone continuation byte or lead byte: not UTF-8
    with pytest.raises(jaxjob.CorruptCheckpointError, match=r"manifest .*manifest.json") as info:
        manifest.read(path)
    assert "not UTF-8" in str(info.value)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=r"manifest.json"):
        jaxjob.restore(prefix, epoch=0)
    (line,) = verify.verify(path)
    assert "manifest.json" in line


# ---- the directory's name and the run ------------------------------------------------------------


def _copy_prefix(saved, tmp_path, name="ckpt"):
    prefix = str(tmp_path / name)
    shutil.copytree(saved, prefix)
    return prefix


@pytest.mark.parametrize("source, target", [("local.0", "local.7"), ("local.1", "local.0")])
def test_a_checkpoint_copied_to_another_epoch_is_refused(saved, tmp_path, source, target):
    """A directory copied or swapped to another epoch's name: restore, load and verify refuse it."""
    prefix = _copy_prefix(saved, tmp_path)
    shutil.rmtree(os.path.join(prefix, target), ignore_errors=True)
    shutil.copytree(os.path.join(prefix, source), os.path.join(prefix, target))
    epoch = int(source.split(".")[1])
    expected = (
        f"the manifest says epoch {epoch} node 'local' but the directory is {target}: "
        "a copied or swapped checkpoint directory"
    )
    wanted = int(target.split(".")[1])
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected):
        manifest.read(os.path.join(prefix, target))
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected):
        jaxjob.restore(prefix, epoch=wanted)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected):
        jaxjob.CheckpointManager(prefix).load(wanted)
    (line,) = jaxjob.CheckpointManager(prefix).verify(wanted)
    assert expected in line


def test_a_checkpoint_copied_to_another_node_is_refused(saved, tmp_path):
    """``local.1`` copied as ``other.1``: the manifest's node is not the directory's."""
    prefix = _copy_prefix(saved, tmp_path)
    shutil.copytree(os.path.join(prefix, "local.1"), os.path.join(prefix, "other.1"))
    with pytest.raises(jaxjob.CorruptCheckpointError, match="node 'local' but the directory is"):
        jaxjob.restore(prefix, node_name="other")


@pytest.mark.parametrize("name", ["copy", "backup-of-local"])
def test_a_copy_whose_name_is_no_node_and_epoch_reads(saved, tmp_path, name):
    """A checkpoint copied to a directory not named ``<node>.<epoch>`` restores as it was saved."""
    target = tmp_path / name
    shutil.copytree(os.path.join(saved, "local.1"), target)
    assert jaxjob.restore(str(target))["i"] == 14


def _two_runs(saved, tmp_path):
    """A db_prefix of its own run whose epoch 1 was replaced by another run's epoch 1."""
    other = str(tmp_path / "other")
    ckpt = jaxjob.CheckpointManager(other)
    for epoch in (0, 1):
        ckpt.save(epoch, jaxjob.Workspace(_workspace(10 + epoch)))
    ckpt.close()
    shutil.rmtree(os.path.join(other, "local.1"))
    shutil.copytree(os.path.join(saved, "local.1"), os.path.join(other, "local.1"))
    return other


def test_a_checkpoint_copied_from_another_run_is_refused_through_its_db_prefix(saved, tmp_path):
    """Same node and epoch from another db_prefix: restore and load refuse; resume skips it."""
    prefix = _two_runs(saved, tmp_path)
    expected = r"epoch 1 at '.*other/local\.1' is corrupt: it was saved by run [0-9a-f]{32}, but"
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected + ".*copied from another run"):
        jaxjob.restore(prefix)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected):
        jaxjob.CheckpointManager(prefix).load(1)
    ckpt = jaxjob.CheckpointManager(prefix)
    (line,) = ckpt.verify(1)
    assert "copied from another run" in line
    (line,) = verify.verify(prefix)  # jaxjob verify DIR: each checkpoint against the run
    assert "copied from another run" in line and "local.1" in line
    (line,) = verify.verify(os.path.join(prefix, "local.1"))  # inside the prefix: its run
    assert "copied from another run" in line and "local.1" in line
    ckpt.set_params(nodes=["local"])
    assert ckpt.get_resume_from_epoch_id() == 0
    assert jaxjob.restore(prefix, epoch=0)["i"] == 70  # the run's own epoch is untouched
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected):
        jaxjob.restore(os.path.join(prefix, "local.1"))  # the directory inside the prefix too
    alone = str(tmp_path / "alone" / "local.1")
    shutil.copytree(os.path.join(prefix, "local.1"), alone)
    assert verify.verify(alone) == []  # a directory of its own: its own run's
    assert jaxjob.restore(alone)["i"] == 14


@pytest.mark.parametrize(
    "case",
    ["shape negative", "owner_process past the count", "checksums naming no file", "metric NaN"],
)
def test_auto_resume_passes_over_a_crafted_manifest(saved, tmp_path, case):
    """A crafted newest epoch is reported by verify and passed over by auto-resume, no crash."""
    prefix = _copy_prefix(saved, tmp_path)
    path = os.path.join(prefix, "local.1")
    with open(_file(path)) as f:
        crafted = json.load(f)
    edit, match = CRAFTED[case]
    edit(crafted)
    _write(path, crafted)
    ckpt = jaxjob.CheckpointManager(prefix)
    (line,) = ckpt.verify(1)
    assert "is malformed" in line
    ckpt.set_params(nodes=["local"])
    assert ckpt.get_resume_from_epoch_id() == 0
    with pytest.raises(jaxjob.CorruptCheckpointError, match=match):
        jaxjob.restore(prefix)


def test_a_multi_node_resume_passes_over_another_runs_epoch(tmp_path):
    """MultiNodeCheckpointManager's resume decision checks the run too: it falls back."""
    prefix, other = str(tmp_path / "run"), str(tmp_path / "other")
    for where in (prefix, other):
        ckpt = jaxjob.MultiNodeCheckpointManager(where)
        ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
        for epoch in (0, 1):
            ckpt.save(epoch, jaxjob.Workspace({"x": jnp.ones(3) * epoch, "y": jnp.ones(2)}))
        ckpt.close()
    shutil.rmtree(os.path.join(prefix, "a.1"))
    shutil.copytree(os.path.join(other, "a.1"), os.path.join(prefix, "a.1"))
    fresh = jaxjob.MultiNodeCheckpointManager(prefix)
    fresh.set_params(nodes=["a", "b"])
    assert fresh.get_resume_from_epoch_id() == 0


def test_a_manifest_read_checks_each_leaf_entry_once(doc, tmp_path, monkeypatch):
    """The whole document's schema check covers every leaf entry: reading the entries into
    LeafSpecs does not check them again (it did: 2 checks a leaf, ~1/3 of a manifest's read)."""
    from jaxjob._src.checkpoint import schema

    path = str(tmp_path / "local.0")
    _write(path, copy.deepcopy(doc))
    checked = []
    real = schema._check_leaf
    monkeypatch.setattr(schema, "_check_leaf", lambda entry: (checked.append(entry), real(entry)))
    found = manifest.read(path)
    assert (
        sorted(e["name"] for e in checked)
        == sorted(found.leaves)
        == sorted(e["name"] for e in doc["leaves"])
    )
