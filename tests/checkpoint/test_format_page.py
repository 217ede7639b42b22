"""The checkpoint package: no import circle in it, and FORMAT.md, its page of the on-disk format.

FORMAT.md (``jaxjob/_src/checkpoint/FORMAT.md``) is generated from :data:`FILES` and
:data:`FIELDS` below: edit them and run ``python tests/checkpoint/test_format_page.py --write``.
"""

import ast
import json
import os
import re
import sys
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest
from test_layers import _circle  # the one import-graph walk of the suite

import jaxjob

PACKAGE = "jaxjob._src.checkpoint"
SRC = os.path.join(os.path.dirname(jaxjob.__file__), "_src")
CHECKPOINT = os.path.join(SRC, "checkpoint")
PAGE = os.path.join(CHECKPOINT, "FORMAT.md")

# When a file exists. The test's run (one process, with outputs and a local tier, listed while
# its manager still holds the node) meets the conditions of SAVED.
EVERY = "every save"
SHARED = "OCDBT: every save but `ALONE`'s"
OUTPUTS = "a save with outputs"
RUNNER = "a `JobRunner` run"
LOCAL = "a run with a local tier"
HELD = "while a manager holds the node"
ALONE = "`ALONE`: one process saves it alone in a multi-process job (`owner_process`, local tier)"
IN_FLIGHT = "while a save is in flight (local disk)"
DELETING = "while retention deletes it (local disk)"
SAVED = (EVERY, SHARED, OUTPUTS, RUNNER, LOCAL, HELD)

PLACEHOLDERS = {  # placeholder -> (what it stands for, its regular expression)
    "<node>": ("a node name", r"[^/]+"),
    "<epoch>": ("an epoch, not zero-padded", r"\d+"),
    "<p>": ("a process index", r"\d+"),
    "<tree>": ("`state` or `outputs`", r"(?:state|outputs)"),
    "<item>": ("`state`, `outputs` or `jaxjob`", r"(?:state|outputs|jaxjob)"),
    "<name>": ("a leaf's stored name (it may hold `/`)", r"[^/]+(?:/[^/]+)*"),
    "<hash>": ("hex digits", r"[0-9a-f]+"),
    "<chunk>": ("a zarr chunk's index (`0`, `0.0`)", r"\d+(?:\.\d+)*"),
    "<ns>": ("nanoseconds", r"\d+"),
    "*": ("anything", r".*"),
}


class File(NamedTuple):
    """One row of the page: a path under the ``db_prefix`` (a folder ends in ``/``).

    ``writes`` and ``reads`` name modules by their path under ``jaxjob/_src`` (or a package
    folder) in backticks; ``names`` are the strings each module named there says the file by.
    """

    path: str
    when: str
    what: str
    writes: str
    reads: str
    names: tuple[str, ...] = ()


PREFIX = [
    File(
        ".jaxjob/run.json",
        EVERY,
        "the prefix's run id, which every checkpoint's manifest records: an epoch of another "
        "run is refused",
        "`checkpoint/run_identity.py` (the first writer)",
        "`checkpoint/run_identity.py` (every read)",
        ("run.json",),
    ),
    File(
        ".jaxjob/<node>.lock",
        HELD,
        "the node's writer lock: host, pid, boot id, PID namespace, lease time; deleted when "
        "released",
        "`manager/lock/writer_lock.py` (taken, renewed, released; its record on local disk or "
        "an object store: `manager/lock/`)",
        "`manager/lock/writer_lock.py` (every writer before it writes)",
        (".lock",),
    ),
    File(
        ".jaxjob/history/<node>.jsonl",
        RUNNER,
        "`runner.history`: a header naming the life, then one record per epoch",
        "`run/history.py` (process 0 of the run holding the lock)",
        "`run/history.py` (`train` on resume)",
        (".jsonl",),
    ),
    File(
        ".jaxjob/tiers.json",
        LOCAL,
        "where the run's local tier is (`LocalTier`'s path template)",
        "`checkpoint/listing.py` (the first local save)",
        "`checkpoint/listing.py` (`jaxjob ls`)",
        ("tiers.json",),
    ),
    File(
        "jaxjob_metadata.jsonl",
        RUNNER,
        "the default metadata handler's log: one JSON line per committed epoch (event, epoch, "
        "time, run id)",
        "`manager/metadata.py` (`jaxjob.DiskMetadataHandler`, process 0)",
        "`checkpoint/run_identity.py` (the run id, when `run.json` is lost); otherwise a log "
        "for people and tools",
        ("jaxjob_metadata.jsonl",),
    ),
    File(
        "<node>.<epoch>.orbax-checkpoint-tmp*/",
        IN_FLIGHT,
        "a save in flight: never listed or loaded",
        "Orbax",
        "`checkpoint/layout.py` (listing skips it), `manager/retention/leftovers.py` (the next "
        "lock holder removes a killed save's)",
        ("orbax-checkpoint-tmp",),
    ),
    File(
        "<node>.<epoch>.deleting-<ns>/",
        DELETING,
        "an epoch that retention deletes, already uncommitted",
        "`manager/retention/deleting.py` (renamed from `<node>.<epoch>/`)",
        "`manager/retention/leftovers.py` (removed after the next commit)",
        ("deleting-",),
    ),
]

CHECKPOINT_FILES = [
    File(
        "<node>.<epoch>/commit_success.txt",
        EVERY,
        "the commit marker, written last: the checkpoint is committed once it exists",
        "Orbax's commit, replaced by `internals/orbax_commit.py` (a durable rename on local "
        "disk, a commit file on object stores)",
        "`checkpoint/layout.py` (committed epochs)",
        ("commit_success.txt",),
    ),
    File(
        "<node>.<epoch>/_CHECKPOINT_METADATA",
        EVERY,
        "Orbax's step metadata: the item handlers, start and commit times",
        "Orbax; `internals/orbax_handlers.py` (the manifest handler's recorded name)",
        "Orbax; `internals/orbax_files.py` (the commit times)",
        ("_CHECKPOINT_METADATA", "step metadata"),
    ),
    File(
        "<node>.<epoch>/jaxjob/manifest.json",
        EVERY,
        "the manifest (its fields below), with its own CRC-32C",
        "`checkpoint/manifest.py` (built), `internals/orbax_handlers.py` (written, on process 0 "
        "or the owner)",
        "`checkpoint/manifest.py` (every read, first), `checkpoint/schema.py` (every field "
        "checked)",
        ("manifest.json", "manifest"),
    ),
    File(
        "<node>.<epoch>/jaxjob/checksums.<p>.json",
        EVERY,
        "the CRC-32C of every shard process `<p>` wrote, with each leaf's dtype and shape, and "
        "its own CRC-32C",
        "`checkpoint/checksum.py` (hashed while Orbax writes), `internals/orbax_handlers.py` "
        "(written)",
        "`checkpoint/checksum.py` (every restore, each shard read), `checkpoint/leaf_check.py` "
        "(`verify`: every leaf)",
        ("checksums.",),
    ),
    File(
        "<node>.<epoch>/jaxjob/files.json",
        EVERY,
        "the file table: every file's size and CRC-32C (and SHA-256 up to 64 KiB), with its own "
        "CRC-32C",
        "`base/file_table.py`, by the committing process in `internals/orbax_commit.py`, just "
        "before the commit marker",
        "`checkpoint/files.py` (every read, before Orbax opens a file)",
        ("files.json", "CHECKPOINT_TABLE"),
    ),
    File(
        "<node>.<epoch>/<item>/commit_success.txt",
        EVERY,
        "Orbax's marker of each item",
        "Orbax",
        "Orbax",
    ),
    File(
        "<node>.<epoch>/<tree>/",
        EVERY,
        "`state`: the persistent leaves; `outputs` (a save with outputs): the epoch outputs "
        "that the stop conditions read. A flat Orbax PyTree keyed by stored name",
        "`checkpoint/io.py` (Orbax's `PyTreeCheckpointHandler`), each leaf encoded by "
        "`checkpoint/storage.py` with the writer's codec (`checkpoint/codec.py`)",
        "`checkpoint/io.py`, `checkpoint/storage.py` (only the leaves asked for), each leaf "
        "decoded by the reader's codec",
        ("state", "outputs"),
    ),
    File(
        "<node>.<epoch>/<tree>/_METADATA",
        EVERY,
        "Orbax's PyTree metadata: each stored name's type and shape",
        "Orbax",
        "Orbax",
    ),
    File(
        "<node>.<epoch>/<tree>/_sharding",
        SHARED,
        "how each `jax.Array` leaf was sharded (JSON)",
        "Orbax",
        "Orbax; `internals/orbax_files.py` (the saved shardings: restore, `jaxjob show`)",
        ("_sharding",),
    ),
    File(
        "<node>.<epoch>/<tree>/array_metadatas/process_<p>",
        SHARED,
        "Orbax's array metadata of process `<p>`'s writes",
        "Orbax",
        "Orbax",
    ),
    File(
        "<node>.<epoch>/<tree>/manifest.ocdbt",
        SHARED,
        "the OCDBT database's manifest, over every process's",
        "Orbax (TensorStore)",
        "Orbax; `checkpoint/checksum.py` (the data files of a damaged leaf, named)",
        ("manifest.ocdbt",),
    ),
    File(
        "<node>.<epoch>/<tree>/d/<hash>",
        SHARED,
        "the OCDBT B-tree nodes of the merged database",
        "Orbax (TensorStore)",
        "Orbax",
    ),
    File(
        "<node>.<epoch>/<tree>/ocdbt.process_<p>/manifest.ocdbt",
        SHARED,
        "process `<p>`'s OCDBT database manifest",
        "Orbax (TensorStore)",
        "Orbax",
    ),
    File(
        "<node>.<epoch>/<tree>/ocdbt.process_<p>/d/<hash>",
        SHARED,
        "process `<p>`'s data files: the bytes of its shards and host-local rows",
        "Orbax (TensorStore)",
        "Orbax; `checkpoint/checksum.py` (the data files of a damaged leaf, named)",
        ("ocdbt.process_",),
    ),
    File(
        "<node>.<epoch>/<tree>/<name>/.zarray",
        ALONE,
        "one leaf's zarr metadata, in a directory of its stored name",
        "Orbax (TensorStore)",
        "Orbax",
    ),
    File(
        "<node>.<epoch>/<tree>/<name>/<chunk>",
        ALONE,
        "one leaf's bytes",
        "Orbax (TensorStore)",
        "Orbax; `checkpoint/checksum.py` (the directory of a damaged leaf, named)",
        ("zarr",),
    ),
]
FILES = PREFIX + CHECKPOINT_FILES


class Field(NamedTuple):
    """A field of ``jaxjob/manifest.json`` and the modules (in backticks) making and reading it."""

    name: str
    what: str
    modules: str


FIELDS = [
    Field("format", "the format version (older ones are read)", "`checkpoint/manifest.py`"),
    Field(
        "self_checksum",
        "the CRC-32C of the rest of the document",
        "`base/file_table.py` (made and checked for each of jaxjob's JSON files)",
    ),
    Field("epoch", "the epoch it holds", "`checkpoint/manifest.py`"),
    Field("node", "the node it belongs to", "`checkpoint/manifest.py`, `checkpoint/layout.py`"),
    Field("tier", '`"persistent"` or `"local"`', "`checkpoint/manifest.py`"),
    Field(
        "process_count",
        "how many processes saved it",
        "`checkpoint/manifest.py`, `checkpoint/hostlocal.py`",
    ),
    Field("owner_process", "the process that wrote it alone, or null", "`checkpoint/manifest.py`"),
    Field("time", "when the save started (seconds)", "`checkpoint/manifest.py`"),
    Field("run", "the prefix's run id (`.jaxjob/run.json`)", "`checkpoint/run_identity.py`"),
    Field(
        "life",
        "the id of the `train` call that saved it",
        "`run/resume.py`, `checkpoint/manifest.py`",
    ),
    Field(
        "resumed_from",
        "the epoch that life resumed from, or null",
        "`manager/save/writer.py`, `checkpoint/manifest.py`",
    ),
    Field("state", "persistent name -> its tree structure", "`checkpoint/tree.py`"),
    Field("outputs", "output name -> its tree structure", "`checkpoint/tree.py`"),
    Field(
        "leaves",
        "one leaf spec per stored leaf: stored name, key path, kind, dtype, shape, PRNG "
        "implementation, host-local bytes, device",
        "`checkpoint/leaf_spec.py`, `checkpoint/dtypes.py`",
    ),
    Field("metrics", "the scalars retention ranks epochs by", "`manager/retention/metrics.py`"),
    Field(
        "checksums",
        "the algorithm and each saving process's checksum file",
        "`checkpoint/checksum.py`",
    ),
    Field(
        "devices", "the saving devices: platform, count, memory kinds", "`checkpoint/manifest.py`"
    ),
]


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _file_rows(files):
    return _table(
        ("path", "when", "what", "written by", "read by"),
        ((f"`{f.path}`", f.when, f.what, f.writes, f.reads) for f in files),
    )


def _field_row(field):
    return f"`{field.name}`", field.what, field.modules


def render():
    """The text of FORMAT.md."""
    placeholders = [f"`{p}` {what}" for p, (what, _) in PLACEHOLDERS.items()]
    lines = [
        "# The on-disk format, file by file",
        "",
        "<!-- Generated by `python tests/checkpoint/test_format_page.py --write` from its FILES",
        "and FIELDS tables: edit those, not this page. -->",
        "",
        "Every file that jaxjob writes under a `db_prefix` (local disk, `gs://`, `s3://`) and",
        "under a local tier's directories, and the modules (paths under `jaxjob/_src/`) that write",
        "and read it: to change the format, start there. `docs/format.md` is the users' view of",
        "the same files. `tests/checkpoint/test_format_page.py` saves checkpoints and checks that",
        "every file they hold is on this page, and that each module named here exists and names",
        "its file.",
        "",
        "Placeholders: " + "; ".join(placeholders) + ".",
        "",
        "## The `db_prefix`",
        "",
        *_file_rows(PREFIX),
        "",
        "## One checkpoint: `<node>.<epoch>/`",
        "",
        "An Orbax composite checkpoint of the items `state`, `outputs` and `jaxjob`, written",
        "and read through one handle, `checkpoint/io.py`; committed once its `commit_success.txt`",
        "exists.",
        "",
        *_file_rows(CHECKPOINT_FILES),
        "",
        "## The manifest: `<node>.<epoch>/jaxjob/manifest.json`",
        "",
        "One JSON object; `checkpoint/manifest.py` builds and reads it, `checkpoint/schema.py`",
        "checks every field on every read.",
        "",
        *_table(("field", "what", "made and read by"), map(_field_row, FIELDS)),
        "",
        "## A local tier",
        "",
        "Each process's local-tier directory (`LocalTier`'s path, `{process}` filled in) holds",
        "`<node>.<epoch>/` checkpoints of the files above (and the transient folders of a save",
        "in flight or an epoch being deleted), nothing else: that process writes its copy alone",
        '(`ALONE` in a multi-process job), and its manifest\'s `tier` is `"local"`.',
        "",
    ]
    return "\n".join(lines)


def _pattern(path):
    """The regular expression of a page path: its placeholders replaced, the rest literal."""
    tokens = re.split("(" + "|".join(map(re.escape, PLACEHOLDERS)) + ")", path)
    return re.compile(
        "".join(PLACEHOLDERS[t][1] if t in PLACEHOLDERS else re.escape(t) for t in tokens)
    )


def _modules(text):
    """The module paths (``checkpoint/manifest.py``) and package folders (``manager/lock/``)
    under jaxjob/_src that ``text`` names in backticks."""
    layers = "|".join(d for d in sorted(os.listdir(SRC)) if d.isidentifier() and d[0] != "_")
    return re.findall(rf"`((?:{layers})/[a-z_/]*(?:\.py|/))`", text)


def _listing(root):
    """Every folder (ending in ``/``) and file under ``root``, relative to it."""
    found = []
    for directory, dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        found += [os.path.join(rel, d).removeprefix("./") + "/" for d in dirs]
        found += [os.path.join(rel, f).removeprefix("./") for f in files]
    return found


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run's ``db_prefix`` and local-tier folder, listed while its manager holds the node."""
    base = tmp_path_factory.mktemp("format")
    prefix, local = base / "db", base / "local"
    job = jaxjob.Job()
    job.init_group.add(
        lambda ws: {"params": {"w": jnp.zeros(3)}, "step": np.int64(0), "n": 1}, name="init"
    )
    job.epoch_group.add(
        lambda ws: {"params": {"w": ws["params"]["w"] + 1}, "done": ws["params"]["w"][0] >= 2},
        name="train",
    )
    job.add_stop_condition("done")
    tier = jaxjob.LocalTier(str(local / "{process}"), every_epochs=1)
    ckpt = jaxjob.CheckpointManager(str(prefix), local=tier)
    jaxjob.JobRunner(job, ckpt, save_every_epochs=2).train(jaxjob.Session())
    found = {"db_prefix": _listing(prefix), "local tier": _listing(local / "0")}
    ckpt.close()
    manifest = next(p for p in found["db_prefix"] if p.endswith("/jaxjob/manifest.json"))
    with open(prefix / manifest) as f:
        found["manifest"] = sorted(json.load(f))
    return found


def test_the_page_is_generated_from_the_tables():
    """FORMAT.md is what the tables here generate (rewrite it with --write)."""
    with open(PAGE) as f:
        assert f.read() == render(), "run: python tests/checkpoint/test_format_page.py --write"


@pytest.mark.parametrize("where", ["db_prefix", "local tier"])
def test_every_file_of_a_saved_run_is_on_the_page(saved, where):
    """Every file and folder a run leaves is a row of the page (folders: of a row's path)."""
    rows = [_pattern(f.path) for f in FILES]
    rows += [_pattern(folder + "/") for f in FILES for folder in _parents(f.path)]
    missing = [path for path in saved[where] if not any(r.fullmatch(path) for r in rows)]
    assert not missing, f"files of a saved run that FORMAT.md does not name: {sorted(missing)}"


def _parents(path):
    """The folders above ``path`` (``a/b/c`` -> ``a``, ``a/b``)."""
    parts = path.rstrip("/").split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


@pytest.mark.parametrize("where", ["db_prefix", "local tier"])
def test_every_row_a_save_makes_is_found_in_a_saved_run(saved, where):
    """A row of a condition the test's run meets matches a file of it: no row outlives its file."""
    rows = FILES if where == "db_prefix" else CHECKPOINT_FILES
    unmatched = [
        f.path
        for f in rows
        if f.when in SAVED and not any(map(_pattern(f.path).fullmatch, saved[where]))
    ]
    assert not unmatched, f"rows of FORMAT.md that the saved run has no file for: {unmatched}"


def test_the_manifest_table_names_every_field(saved):
    """The manifest's fields are the table's, in a real save and in the schema."""
    from jaxjob._src.checkpoint import schema

    assert sorted(f.name for f in FIELDS) == saved["manifest"] == sorted(schema.FIELDS)


def _cells():
    for f in FILES:
        for cell in (f.writes, f.reads):
            yield f.path, cell, f.names
    for field in FIELDS:
        yield field.name, field.modules, (field.name,)


def _says(module, names):
    """Whether ``module`` (a path under jaxjob/_src) says one of ``names``."""
    with open(os.path.join(SRC, module)) as f:
        text = f.read()
    return any(name in text for name in names)


def test_every_module_named_exists_and_names_its_file():
    """Each module the page names exists under jaxjob/_src and says the file's (or field's) name."""
    missing = sorted({m for m in _modules(render()) if not os.path.exists(os.path.join(SRC, m))})
    assert not missing, f"FORMAT.md names what jaxjob/_src does not hold: {missing}"
    silent = [
        f"{path}: {module} says none of {list(names)}"
        for path, cell, names in _cells()
        for module in _modules(cell)
        if module.endswith(".py") and not _says(module, names)
    ]
    assert not silent, "\n".join(silent)


def _imported(tree):
    """The package's modules that ``tree`` imports, under TYPE_CHECKING and in functions too."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith(PACKAGE + ".")]
            found |= {n.removeprefix(PACKAGE + ".").split(".")[0] for n in names}
    return found


def _graph():
    """Module name (``codec``) -> the package's modules it imports."""
    graph = {}
    for name in sorted(os.listdir(CHECKPOINT)):
        if name.endswith(".py") and name != "__init__.py":
            with open(os.path.join(CHECKPOINT, name)) as f:
                graph[name[: -len(".py")]] = _imported(ast.parse(f.read()))
    return graph


def test_the_checkpoint_package_has_no_import_circle():
    """No module of checkpoint/ reaches itself through its imports, TYPE_CHECKING ones included."""
    graph = _graph()
    assert {"codec", "hostlocal", "schema", "manifest", "leaf_spec", "tree"} <= set(graph)
    circle = _circle(graph)
    assert circle is None, f"an import circle in jaxjob/_src/checkpoint: {' -> '.join(circle)}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with open(PAGE, "w") as f:
        f.write(render())
