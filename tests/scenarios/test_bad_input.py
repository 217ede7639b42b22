"""Bad input, catalogued: each row of docs/reliability.md's table raises what it says, losing
nothing.

``CASES`` is the catalogue: the docs' table is rendered from it
(``test_readme_table_is_the_catalogue`` fails, printing the table, when they drift), and
``test_bad_input`` runs every row against a db_prefix holding a committed epoch 0,
which must still load unchanged afterwards.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import paths
import pytest
from damage import reseal

import jaxjob
from jaxjob._src.checkpoint import checksum

PAGE = Path(paths.DOCS) / "reliability.md"
BEGIN = "<!-- bad-input table: rendered from tests/scenarios/test_bad_input.py CASES -->"
END = "<!-- end of the bad-input table -->"


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: the input, what jaxjob does, what the user does, and how the test provokes it."""

    input: str
    happens: str
    user_does: str
    error: type[BaseException] | None
    match: str
    provoke: Callable[[str, Path], object]


def manager(prefix):
    return jaxjob.CheckpointManager(prefix)


def refused_save(prefix, workspace):
    """Saves ``workspace`` as epoch 1, closing the manager (its lock) whatever happens."""
    ckpt = manager(prefix)
    try:
        ckpt.save(1, workspace)
    finally:
        ckpt.close()


def manifest_of(prefix):
    return Path(prefix) / "local.0" / "jaxjob" / "manifest.json"


def edit_manifest(prefix, edit, *, resign=False):
    """Edits the manifest by hand, or as a crafted one that also fixes its own checksum."""
    doc = json.loads(manifest_of(prefix).read_text())
    edit(doc)
    if resign:
        doc["self_checksum"] = checksum.doc_checksum(doc)
    manifest_of(prefix).write_text(json.dumps(doc))
    if resign:
        reseal(str(manifest_of(prefix).parent.parent))


def huge_shape(doc):
    doc["leaves"][0]["shape"] = [10**6, 10**6]  # 4 TB of float32


def other_job(prefix, tmp):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"params": jnp.zeros(3)})
    job.epoch_group.add(lambda ws: {"params": ws["params"] + 1})
    ckpt = manager(prefix)
    try:
        return jaxjob.JobRunner(job, ckpt).train(jaxjob.Session())
    finally:
        ckpt.close()  # releases the lock it took; nothing else was written


def missing_stop_key(prefix, tmp):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "loss": ws["x"]})
    job.add_stop_condition("converged")
    return jaxjob.JobRunner(job, manager(tmp / "fresh")).train(jaxjob.Session())


def a_file(tmp):
    (tmp / "file").write_text("not a directory")
    return tmp / "file"


def home_prefix(prefix, tmp):
    os.environ["HOME"] = str(tmp)
    found = manager("~/runs/x").db_prefix
    assert found == str(tmp / "runs" / "x"), found
    assert not Path("~").exists()


def damaged_metadata(prefix, tmp):
    """Flips a byte of Orbax's array metadata, restores, and undoes the flip."""
    file = Path(prefix) / "local.0" / "state" / "array_metadatas" / "process_0"
    data = file.read_bytes()
    file.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    try:
        jaxjob.restore(prefix)
    finally:
        file.write_bytes(data)


CASES = [
    Case(
        "`restore(path, leaves=[...])` naming a leaf the checkpoint lacks",
        "`KeyError` listing the available names",
        "pick names from the list (`jaxjob show PATH`)",
        KeyError,
        r"leaves \['nope'\] match nothing in the checkpoint .*; available: \['w'\]",
        lambda p, t: jaxjob.restore(p, leaves=["nope"]),
    ),
    Case(
        '`restore(path, sharding={"parms": ...})` naming no restored key or saved name',
        "`KeyError` listing the unmatched keys and the available names",
        "use a name from the list",
        KeyError,
        r"sharding keys \['parms'\] match no restored key and no name in the checkpoint.*\['w'\]",
        lambda p, t: jaxjob.restore(
            p, sharding={"parms": jax.sharding.SingleDeviceSharding(jax.devices()[0])}
        ),
    ),
    Case(
        "`load(epoch)` of an epoch that is not committed",
        "`FileNotFoundError` listing the committed epochs",
        "load one of them (`jaxjob ls DIR`)",
        FileNotFoundError,
        r"no committed checkpoint for node 'local' at epoch 7 .*committed epochs: \[0\]",
        lambda p, t: manager(p).load(7),
    ),
    Case(
        "`save(-1, ...)`",
        "`ValueError`; nothing is written (no `local.-1`)",
        "pass an epoch >= 0",
        ValueError,
        r"epoch must be >= 0, got -1",
        lambda p, t: manager(p).save(-1, {"w": jnp.ones(3)}),
    ),
    Case(
        "`save(True, ...)` or `save(1.0, ...)`",
        "`TypeError` naming the type",
        "pass an int",
        TypeError,
        r"epoch must be an int >= 0, got True \(bool\)",
        lambda p, t: manager(p).save(True, {"w": jnp.ones(3)}),
    ),
    Case(
        "`load(-1)`, `restore(path, epoch=-1)`",
        "`ValueError`",
        "pass an epoch >= 0",
        ValueError,
        r"epoch must be >= 0, got -1",
        lambda p, t: jaxjob.restore(p, epoch=-1),
    ),
    Case(
        "`load(1.0)`, `load(False)`",
        "`TypeError` naming the type",
        "pass an int",
        TypeError,
        r"epoch must be an int >= 0, got 1.0 \(float\)",
        lambda p, t: manager(p).load(1.0),
    ),
    Case(
        "a `db_prefix` that is a file",
        "`NotADirectoryError` when the manager is made",
        "pass a directory",
        NotADirectoryError,
        r"db_prefix '.*/file' is a file, not a directory",
        lambda p, t: manager(a_file(t)),
    ),
    Case(
        "a `db_prefix` that cannot be created or written (under a file, no permission)",
        "`save` raises the `OSError` (e.g. `NotADirectoryError`, `PermissionError`) naming "
        "`db_prefix`; the runner logs it as a failed save (or raises, "
        '`on_save_error="raise"`)',
        "pass a directory you can write to",
        NotADirectoryError,
        r"checkpoint db_prefix '.*/file/run' is not a writable directory",
        lambda p, t: manager(a_file(t) / "run").save(0, {"w": jnp.ones(3)}),
    ),
    Case(
        "a `db_prefix` or checkpoint that vanished (deleted, unmounted)",
        "`FileNotFoundError` naming the path",
        "point at the right directory; restart from scratch if it is gone",
        FileNotFoundError,
        r"no checkpoint directory or db_prefix at '.*/gone'",
        lambda p, t: jaxjob.restore(t / "gone"),
    ),
    Case(
        "auto-resume from another job's checkpoint (other names)",
        "`ValueError` before anything runs, naming the names either side lacks",
        "use another `db_prefix`, or the job that wrote it",
        ValueError,
        r"cannot resume from the checkpoint of epoch 0 in '.*': the init group creates "
        r"\['params'\], which it lacks and it holds \['w'\], which the init group no longer",
        other_job,
    ),
    Case(
        "a restore target of another shape",
        "`ValueError` naming the key path and both shapes",
        "fix the model, or restore without `target` to see what was saved",
        ValueError,
        r"\['w'\]: shape mismatch: target \(4,\), checkpoint \(3,\)",
        lambda p, t: manager(p).load(0, targets={"w": jax.ShapeDtypeStruct((4,), jnp.float32)}),
    ),
    Case(
        "a restore target of another dtype",
        "`ValueError` naming the key path and both dtypes",
        "fix the model's dtype (or cast after restoring)",
        ValueError,
        r"\['w'\]: dtype mismatch: target int32, checkpoint float32",
        lambda p, t: manager(p).load(0, targets={"w": jax.ShapeDtypeStruct((3,), jnp.int32)}),
    ),
    Case(
        "a workspace name unsafe as a path (`../x`, `/abs`, NUL)",
        "`save` raises `ValueError`; nothing is written",
        "rename the leaf",
        ValueError,
        r"workspace name '../x' cannot be checkpointed",
        lambda p, t: manager(p).save(1, {"../x": jnp.ones(3)}),
    ),
    Case(
        "a leaf Orbax cannot store: a zero-size `jax.Array`, or dtype `uint2`, `uint4` or "
        "`float8_e4m3` (NumPy leaves of any plain dtype or size are stored, as bytes; structured "
        "dtypes are refused alike)",
        "`save` (and `train`, whatever `on_save_error`) raises a `TypeError` naming the key "
        "path, dtype and shape; nothing is written",
        "store it as `uint8` (`x.astype(jnp.uint8)`, or `jax.lax.bitcast_convert_type` for "
        "float8), or keep it out of the persistent workspace",
        TypeError,
        r"cannot checkpoint the jax.Array at \['q'\] \(dtype uint4, shape \(4,\)\)",
        lambda p, t: refused_save(p, {"q": jnp.zeros(4, jnp.uint4)}),
    ),
    Case(
        "a node name unsafe as a path (`../x`, `a/b`, empty, NUL)",
        "`ValueError` when the manager is made",
        "use a plain name",
        ValueError,
        r"node_name must be a plain directory name .*got '../x'",
        lambda p, t: jaxjob.CheckpointManager(p, node_name="../x"),
    ),
    Case(
        "`restore` of a directory that is not a checkpoint",
        "`FileNotFoundError` saying so",
        "pass a checkpoint directory or a `db_prefix`",
        FileNotFoundError,
        r"no committed checkpoint under '.*/plain'",
        lambda p, t: (os.makedirs(t / "plain" / "data"), jaxjob.restore(t / "plain"))[1],
    ),
    Case(
        "a truncated manifest",
        "`ValueError` naming the manifest file",
        "restore another epoch; the damaged one cannot be read",
        ValueError,
        r"the manifest '.*local.0/jaxjob/manifest.json' is not valid JSON",
        lambda p, t: (
            manifest_of(p).write_text(manifest_of(p).read_text()[:40]),
            jaxjob.restore(p),
        ),
    ),
    Case(
        "a hand-edited manifest (a field missing)",
        "`CorruptCheckpointError` (a `ValueError`): it fails its own checksum",
        "restore another epoch, or undo the edit",
        jaxjob.CorruptCheckpointError,
        r"epoch 0 at '.*local.0' is corrupt: the manifest '.*manifest.json' fails its checksum",
        lambda p, t: (edit_manifest(p, lambda d: d.pop("leaves")), jaxjob.restore(p)),
    ),
    Case(
        "a crafted manifest with a field missing (its checksum fixed to match)",
        "`CorruptCheckpointError` (a `ValueError`) naming the manifest file and the field",
        "restore another epoch",
        jaxjob.CorruptCheckpointError,
        r"epoch 0 at '.*local.0' is corrupt: the manifest '.*manifest.json' is malformed: "
        r"the manifest lacks \['leaves'\]",
        lambda p, t: (
            edit_manifest(p, lambda d: d.pop("leaves"), resign=True),
            jaxjob.restore(p),
        ),
    ),
    Case(
        "a checkpoint of an unknown format version",
        "`ValueError` naming both versions",
        "read it with the jaxjob that wrote it",
        ValueError,
        r"has checkpoint format 99; this jaxjob reads format \d+",
        lambda p, t: (edit_manifest(p, lambda d: d.update(format=99)), jaxjob.restore(p)),
    ),
    Case(
        "a manifest declaring a huge shape",
        "`CorruptCheckpointError` (a `ValueError`) before any allocation",
        "restore another epoch",
        jaxjob.CorruptCheckpointError,
        r"declares shapes that its stored arrays do not have",
        lambda p, t: (edit_manifest(p, huge_shape, resign=True), jaxjob.restore(p)),
    ),
    Case(
        "two managers of one node in a job (`MultiNodeCheckpointManager` given a node twice)",
        "`ValueError` naming the node",
        "list each node once",
        ValueError,
        r"nodes \['a', 'a'\] name \['a'\] more than once",
        lambda p, t: jaxjob.MultiNodeCheckpointManager(p).init(["a", "a"]),
    ),
    Case(
        "a stop condition naming a key nothing sets",
        "`KeyError` before the first epoch runs, listing the names there are (checked when "
        "the epoch group is jitted; a host task's outputs are known only once it runs)",
        "name a workspace leaf or epoch output, or pass a callable",
        KeyError,
        r"stop conditions \['converged'\] name no workspace leaf .* sets \['loss', 'x'\]",
        missing_stop_key,
    ),
    Case(
        "`~` in `db_prefix`",
        "expanded to the home directory (no `./~` is created)",
        "nothing",
        None,
        "",
        home_prefix,
    ),
    Case(
        "a `db_prefix` URL without `//` or with a capital scheme (`s3:bucket/run`, `GS://b/run`)",
        "`ValueError` naming the expected form and the likely meant URL",
        "write `s3://bucket/run`",
        ValueError,
        r"db_prefix 's3:bucket/run' is not a well-formed URL .*did you mean s3://bucket/run\?",
        lambda p, t: jaxjob.CheckpointManager("s3:bucket/run"),
    ),
    Case(
        "a `db_prefix` URL with no bucket (`gs://`, `s3:///run`)",
        "`ValueError` naming the expected form",
        "name the bucket",
        ValueError,
        r"db_prefix 's3:///run' names no bucket \(expected gs://bucket/path or s3://bucket/path",
        lambda p, t: jaxjob.CheckpointManager("s3:///run"),
    ),
    Case(
        "`node_name=` (or a node in `init(nodes)`) that is not a `str`",
        "`TypeError` naming what was given",
        "name nodes with strings (or `jaxjob.Node`s)",
        TypeError,
        r"node_name must be a str, got 5 \(int\)",
        lambda p, t: jaxjob.CheckpointManager(p, node_name=5),
    ),
    Case(
        '`JobRunner(save_every="auto")` without `mtbf_hours=`, or with `save_every_seconds=`',
        "`ValueError` naming what the cost model needs, or the clash",
        "state the job's mean time between failures: `mtbf_hours=`",
        ValueError,
        r"save_every='auto' needs mtbf_hours= \(the job's mean time between failures\)",
        lambda p, t: jaxjob.JobRunner(jaxjob.Job(), save_every="auto"),
    ),
    Case(
        "a checkpoint file damaged outside the arrays (`_CHECKPOINT_METADATA`, "
        "`array_metadatas/*`, an OCDBT manifest): changed, truncated, deleted or another epoch's",
        "`CorruptCheckpointError` naming the file; `jaxjob verify` exits 1; auto-resume falls "
        "back to the newest intact epoch",
        "nothing (auto-resume); to restore by hand, pick an intact epoch (`jaxjob verify DIR`)",
        jaxjob.CorruptCheckpointError,
        r"epoch 0 at '.*local.0' is corrupt: the file '.*array_metadatas/process_0' fails its "
        "checksum",
        damaged_metadata,
    ),
]


def render_table():
    rows = ["| Input | What happens | What you do |", "|---|---|---|"]
    rows += [f"| {c.input} | {c.happens} | {c.user_does} |" for c in CASES]
    return "\n".join([BEGIN, *rows, END])


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """A db_prefix with epoch 0 committed; HOME restored after the test."""
    monkeypatch.setenv("HOME", os.environ.get("HOME", "/"))
    prefix = str(tmp_path / "ckpt")
    ckpt = manager(prefix)
    ckpt.save(0, {"w": jnp.arange(3.0)})
    ckpt.close()
    return prefix


@pytest.mark.parametrize("case", CASES, ids=[c.input for c in CASES])
def test_bad_input(case, committed, tmp_path):
    """The row's input raises its exception with its message; epoch 0 stays committed."""
    manifest = manifest_of(committed).read_bytes()
    table = manifest_of(committed).with_name("files.json")
    sealed = table.read_bytes()
    if case.error is None:
        case.provoke(committed, tmp_path)
    else:
        with pytest.raises(case.error, match=case.match):
            case.provoke(committed, tmp_path)
    manifest_of(committed).write_bytes(manifest)  # undo a deliberate manifest edit
    table.write_bytes(sealed)  # and a forger's new file table
    listed = sorted(e for e in os.listdir(committed) if e != "jaxjob_metadata.jsonl")
    assert listed == [".jaxjob", "local.0"]
    assert os.listdir(Path(committed) / ".jaxjob") == ["run.json"]  # the run id; no lock left
    np.testing.assert_array_equal(jaxjob.restore(committed)["w"], np.arange(3.0))


def test_readme_table_is_the_catalogue():
    """docs/reliability.md's bad-input table is rendered from CASES, row for row."""
    expected = render_table()
    assert expected in PAGE.read_text(), (
        "docs/reliability.md's bad-input table must be:\n" + expected
    )
