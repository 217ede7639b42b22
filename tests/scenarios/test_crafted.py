"""Crafted checkpoints run no code and make jaxjob read or write nothing outside them."""

import ast
import builtins
import importlib
import json
import os
import pickle
import re
import shutil
import sys

import jax.numpy as jnp
import numpy as np
import package_files
import pytest
from damage import flip_file, largest_data_file, reseal, save_epochs

import jaxjob
from jaxjob._src.checkpoint import checksum, verify

JAXJOB = os.path.dirname(jaxjob.__file__)
PAYLOAD = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
def __getattr__(name):
    pathlib.Path({marker!r}).write_text("used " + name)
    raise AttributeError(name)
"""


@pytest.fixture
def saved(tmp_path):
    """A db_prefix with committed epochs 0 and 1 of a small workspace."""
    return save_epochs(tmp_path / "ckpt", lambda e: {"w": jnp.arange(4096.0) + e, "n": np.int64(3)})


def _edit_manifest(path, edit):
    """Applies ``edit`` to the manifest document and re-signs it, as an attacker could."""
    file = os.path.join(path, "jaxjob", "manifest.json")
    with open(file) as f:
        doc = json.load(f)
    edit(doc)
    doc["self_checksum"] = checksum.doc_checksum(doc)
    with open(file, "w") as f:
        json.dump(doc, f)
    reseal(path)


def test_no_module_of_jaxjob_unpickles_evaluates_or_imports_by_name():
    """jaxjob's source uses no pickle or marshal and calls no eval, exec or import_module."""
    banned_modules = {"pickle", "marshal", "shelve", "dill", "cloudpickle"}
    banned_calls = {"eval", "exec", "__import__", "import_module", "getattribute"}
    found, names = [], package_files.py_files(JAXJOB)
    assert len(names) == package_files.PY_FILES, names  # a module moved out of sight fails here
    for name in names:
        with open(os.path.join(JAXJOB, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                found += [f"{name}: import {m}" for m in modules if m in banned_modules]
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                owner = getattr(getattr(func, "value", None), "id", "")
                pickles = any(k.arg == "allow_pickle" for k in node.keywords)
                if called in banned_calls or owner in banned_modules or pickles:
                    found.append(f"{name}:{node.lineno}: {owner}.{called}")
    # The package's lazy loader imports its own submodules, named by constants in its source.
    lazy = [f for f in found if re.fullmatch(r"__init__\.py:\d+: importlib\.import_module", f)]
    assert len(lazy) == 2 and found == lazy
    assert all(m.startswith("jaxjob.") for m in jaxjob._EXPORTS.values())


def test_save_and_restore_run_with_pickle_eval_and_import_by_name_disabled(
    saved, tmp_path, monkeypatch
):
    """A save and a restore succeed while pickle, eval, exec and import_module raise."""

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint path executed or unpickled something")

    # The package's lazy loader imports its own modules by constant names on first access
    # (allowed above); resolve the names used here first, so only the checkpoint path is watched.
    jaxjob.CheckpointManager, jaxjob.Workspace, jaxjob.restore  # noqa: B018

    for owner, name in [
        (pickle, "loads"),
        (pickle, "load"),
        (pickle, "Unpickler"),
        (builtins, "eval"),
        (builtins, "exec"),
        (importlib, "import_module"),
    ]:
        monkeypatch.setattr(owner, name, refuse)
    ckpt = jaxjob.CheckpointManager(saved)
    ckpt.save(2, jaxjob.Workspace({"w": jnp.arange(4096.0) + 2, "n": np.int64(3)}))
    ckpt.wait_until_finished()
    assert ckpt.load(2)["w"][1] == 3.0
    assert ckpt.verify(2) == []
    assert jaxjob.restore(saved, epoch=1)["n"] == 3
    ckpt.close()


def _payload(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    package = tmp_path / "payload_path"
    package.mkdir()
    (package / "crafted_payload.py").write_text(PAYLOAD.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(package))
    return marker


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("dtype", "crafted_payload.Evil", r"dtype 'crafted_payload.Evil' is not one a \w+ leaf"),
        ("kind", "crafted_payload", r'kind is "crafted_payload", expected one of'),
        ("impl", "crafted_payload:evil", r"impl 'crafted_payload:evil' is given for a leaf that"),
        ("path", "__import__('crafted_payload')", None),  # a label in messages
        ("module", "crafted_payload", r"state\['__class__'\] is .*expected a tree node"),
    ],
)
def test_a_manifest_naming_a_module_imports_nothing(
    saved, tmp_path, monkeypatch, field, value, error
):
    """Module names in a re-signed manifest are data: restore fails or ignores them, no import."""
    marker = _payload(tmp_path, monkeypatch)
    path = os.path.join(saved, "local.1")

    def edit(doc):
        if field == "module":  # a structure node naming a module
            doc["state"]["__class__"] = {field: value, "leaf": doc["leaves"][1]["name"]}
        else:
            doc["leaves"][0][field] = value

    _edit_manifest(path, edit)
    if error is None:
        assert sorted(jaxjob.restore(path)) == ["n", "w"]
        assert verify.verify_checkpoint(path) == []
    else:
        with pytest.raises(jaxjob.CorruptCheckpointError, match=error):
            jaxjob.restore(path)
        (line,) = verify.verify_checkpoint(path)
        assert re.search(error, line)
    assert not marker.exists()
    assert "crafted_payload" not in sys.modules


def test_orbax_metadata_naming_a_module_imports_nothing(saved, tmp_path, monkeypatch):
    """Handler and type names in Orbax's own metadata files are not imported."""
    marker = _payload(tmp_path, monkeypatch)
    path = os.path.join(saved, "local.1")
    file = os.path.join(path, "_CHECKPOINT_METADATA")
    with open(file) as f:
        doc = json.load(f)
    doc["item_handlers"] = {item: "crafted_payload.Handler" for item in ("state", "jaxjob")}
    with open(file, "w") as f:
        json.dump(doc, f)
    reseal(path)  # a forger's edit: what is behind the file table must hold
    np.testing.assert_array_equal(jaxjob.restore(path)["w"], np.arange(4096.0) + 1)
    assert not marker.exists()
    assert "crafted_payload" not in sys.modules


def test_leaf_names_with_dotdot_are_refused(saved, tmp_path):
    """A stored leaf name like ``../../x`` is refused before anything is read."""
    path = os.path.join(saved, "local.1")

    def edit(doc):
        old = doc["leaves"][0]["name"]
        doc["leaves"][0]["name"] = "../../outside"
        for entry in doc["state"].values():
            if entry.get("leaf") == old:
                entry["leaf"] = "../../outside"

    _edit_manifest(path, edit)
    with pytest.raises(
        jaxjob.CorruptCheckpointError, match=r'is \{"leaf": "\.\./\.\./outside"\}, expected a tree'
    ):
        jaxjob.restore(path)


def test_checksum_file_names_leaving_the_checkpoint_are_refused(saved, tmp_path):
    """A manifest naming ``../../x.json`` as a checksum file is corrupt; the file is not read."""
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    path = os.path.join(saved, "local.1")
    _edit_manifest(path, lambda doc: doc["checksums"].update(files=["../../../outside.json"]))
    expected = r'malformed: checksums is .*"files": \["\.\./\.\./\.\./outside\.json"\]'
    with pytest.raises(jaxjob.CorruptCheckpointError, match=expected):
        jaxjob.restore(path)
    (line,) = verify.verify_checkpoint(path)
    assert re.search(expected, line)


def test_a_manifest_without_checksums_is_refused(saved):
    """A manifest stripped of its checksum records is corrupt: restore raises, each verify says."""
    path = os.path.join(saved, "local.1")
    _edit_manifest(path, lambda doc: doc.pop("checksums"))
    expected = "is malformed: the manifest lacks ['checksums']"
    with pytest.raises(jaxjob.CorruptCheckpointError, match=re.escape(expected)):
        jaxjob.restore(path)
    (line,) = verify.verify_checkpoint(path)
    assert expected in line
    (line,) = jaxjob.CheckpointManager(saved).verify(1)
    assert expected in line


@pytest.mark.parametrize("which", ["manifest", "data"])
def test_files_replaced_by_links_leading_outside_are_refused(saved, tmp_path, which):
    """A manifest or data file replaced by a link to a file outside the checkpoint is refused."""
    path = os.path.join(saved, "local.1")
    if which == "manifest":
        victim = os.path.join(path, "jaxjob", "manifest.json")
        source = os.path.join(saved, "local.0", "jaxjob", "manifest.json")
    else:
        victim = largest_data_file(path)
        source = largest_data_file(os.path.join(saved, "local.0"))
    outside = tmp_path / "outside"
    shutil.copy(source, outside)
    os.remove(victim)
    os.symlink(outside, victim)
    with pytest.raises(
        jaxjob.CorruptCheckpointError, match="links to files outside the checkpoint"
    ):
        jaxjob.restore(path)
    (line,) = jaxjob.CheckpointManager(saved).verify(1)
    assert victim in line
    ckpt = jaxjob.CheckpointManager(saved)
    ckpt.set_params(nodes=["local"])
    assert ckpt.get_resume_from_epoch_id() == 0  # auto-resume passes over it


def test_a_data_file_linked_to_other_bytes_inside_is_caught_by_its_checksum(saved):
    """A data file replaced by a link to a same-size file with other bytes fails its checksum."""
    path = os.path.join(saved, "local.1")
    victim = largest_data_file(path)
    other = os.path.join(path, "state", "other")
    shutil.copy(victim, other)
    flip_file(other)
    os.remove(victim)
    os.symlink("../../other" if "ocdbt.process" in victim else "../other", victim)
    assert os.path.realpath(victim) == os.path.realpath(other)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=r"leaf w \(\['w'\].*epoch 1"):
        jaxjob.restore(path)


def test_saving_over_an_epoch_linked_outside_deletes_nothing_outside(saved, tmp_path):
    """Saving over an epoch directory that links outside replaces the link, deletes nothing."""
    outside = tmp_path / "elsewhere"
    shutil.copytree(os.path.join(saved, "local.1"), outside / "local.1")
    (outside / "keep.txt").write_text("mine")
    shutil.rmtree(os.path.join(saved, "local.1"))
    os.symlink(outside / "local.1", os.path.join(saved, "local.1"))
    ckpt = jaxjob.CheckpointManager(saved)
    ckpt.save(1, jaxjob.Workspace({"w": jnp.zeros(3), "n": np.int64(0)}))
    ckpt.close()
    assert (outside / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(outside / "local.1")) != []
    assert not os.path.islink(os.path.join(saved, "local.1"))
    assert jaxjob.restore(saved, epoch=1)["w"].tolist() == [0.0, 0.0, 0.0]


def test_bytes_read_as_another_dtype_of_the_same_size_are_refused(tmp_path):
    """A re-signed, re-sealed manifest declaring uint8[4] as float32[1]: the records say uint8."""
    prefix = save_epochs(tmp_path / "ckpt", lambda _: {"b": np.arange(4, dtype=np.uint8)}, [0])
    path = os.path.join(prefix, "local.0")
    _edit_manifest(path, lambda doc: doc["leaves"][0].update(dtype="float32", shape=[1]))
    declared = r"does not declare its leaves as they were saved \(b: saved as \['uint8', \[4\]\]"
    with pytest.raises(jaxjob.CorruptCheckpointError, match=declared):
        jaxjob.restore(path)
    (line,) = verify.verify_checkpoint(path)
    assert re.search(declared, line)


def test_bytes_read_as_another_shape_of_the_same_size_are_refused(tmp_path):
    """A re-signed, re-sealed manifest declaring a float32[6] as float32[2, 3] is refused."""
    leaves = {"a": np.arange(6, dtype=np.float32), "j": jnp.arange(6.0)}
    path = os.path.join(save_epochs(tmp_path / "ckpt", lambda _: leaves, [0]), "local.0")
    for leaf in (0, 1):
        _edit_manifest(path, lambda doc, leaf=leaf: doc["leaves"][leaf].update(shape=[2, 3]))
        refused = r"saved as \['float32', \[6\]\]|declares shapes that its stored arrays do not"
        with pytest.raises(jaxjob.CorruptCheckpointError, match=refused):
            jaxjob.restore(path)
        assert verify.verify_checkpoint(path)
        _edit_manifest(path, lambda doc, leaf=leaf: doc["leaves"][leaf].update(shape=[6]))
