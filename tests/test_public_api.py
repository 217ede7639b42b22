"""The public API: jaxjob's names, where each is defined, and public modules that only re-export."""

import ast
import importlib
import os

import pytest

import jaxjob

# public name -> the module defining it (for a public module: its own name)
PUBLIC = {
    "AutoInterval": "jaxjob._src.run.auto_interval",
    "CheckpointInUseError": "jaxjob._src.base.errors",
    "CheckpointManager": "jaxjob._src.manager.checkpoint_manager",
    "CheckpointOptions": "jaxjob._src.manager.shared",
    "LocalTier": "jaxjob._src.manager.local_tier",
    "CheckpointSaveError": "jaxjob._src.base.errors",
    "CorruptCheckpointError": "jaxjob._src.base.errors",
    "DiskMetadataHandler": "jaxjob._src.manager.metadata",
    "HostTimeoutError": "jaxjob._src.multihost.hosts",
    "LineageError": "jaxjob._src.checkpoint.run_identity",
    "MissingExtraError": "jaxjob._src.base.remote",
    "ProcessCountError": "jaxjob._src.checkpoint.hostlocal",
    "StorageError": "jaxjob._src.base.remote",
    "StorageTimeoutError": "jaxjob._src.base.remote",
    "UnstorableLeafError": "jaxjob._src.checkpoint.leaf_spec",
    "Job": "jaxjob._src.core.job",
    "JobRunner": "jaxjob._src.run.runner",
    "JsonlWriter": "jaxjob._src.run.writers",
    "MetricWriter": "jaxjob._src.run.writers",
    "TensorBoardWriter": "jaxjob._src.run.tensorboard",
    "MetadataHandler": "jaxjob._src.manager.metadata",
    "MultiNodeCheckpointManager": "jaxjob._src.manager.multinode",
    "Node": "jaxjob._src.core.task",
    "Preempted": "jaxjob._src.base.errors",
    "Session": "jaxjob._src.core.session",
    "Task": "jaxjob._src.core.task",
    "TaskGroup": "jaxjob._src.core.task",
    "UploadTaskGroupBuilder": "jaxjob._src.run.upload",
    "Workspace": "jaxjob._src.core.workspace",
    "data": "jaxjob.data",
    "db_name": "jaxjob._src.checkpoint.layout",
    "distributed": "jaxjob.distributed",
    "epoch_limiter": "jaxjob._src.core.job",
    "get_ckpt_filename": "jaxjob._src.checkpoint.layout",
    "hosts": "jaxjob.hosts",
    "keep": "jaxjob.keep",
    "restore": "jaxjob._src.checkpoint.restore",
    "testing": "jaxjob.testing",
}
# public module -> the module it re-exports, and its names
REEXPORTS = {
    "jaxjob.cli": ("jaxjob._src.cli.main", ["main"]),
    "jaxjob.data": ("jaxjob._src.core.data", ["IndexCursor", "Stateful"]),
    "jaxjob.distributed": ("jaxjob._src.multihost.distributed", ["initialize"]),
    "jaxjob.hosts": (
        "jaxjob._src.multihost.hosts",
        ["DEFAULT_TIMEOUT_S", "HostTimeoutError", "decide", "exchange"],
    ),
    "jaxjob.keep": (
        "jaxjob._src.manager.retention.keep",
        ["Best", "Every", "Last", "Policy", "kept", "metric_names", "normalize"],
    ),
    "jaxjob.orbax_adapter": ("jaxjob._src.internals.orbax_handlers", ["ManifestHandler"]),
    "jaxjob.testing": (
        "jaxjob._src.testing.testing",
        [
            "Kill",
            "POINTS",
            "assert_bitwise_equal",
            "assert_checkpoints_equal",
            "dump_workspace",
            "kill_and_resume",
            "run",
            "run_killed",
        ],
    ),
}
PACKAGE = os.path.dirname(jaxjob.__file__)


def test_public_names_are_pinned():
    """jaxjob.__all__ is exactly the public names, and dir(jaxjob) lists each of them."""
    assert jaxjob.__all__ == sorted(PUBLIC)
    assert set(PUBLIC) <= set(dir(jaxjob))


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_name_is_defined_where_pinned(name):
    """jaxjob.X comes from its pinned module, which defines it: a move shows up here. A public
    class names itself jaxjob.X (its __module__), where users import it from."""
    value = getattr(jaxjob, name)
    if name in jaxjob._SUBMODULES:
        assert value.__name__ == PUBLIC[name]
        return
    assert jaxjob._EXPORTS[name] == PUBLIC[name]
    assert getattr(importlib.import_module(PUBLIC[name]), name) is value
    assert name in _defined_names(PUBLIC[name])
    assert value.__module__ == ("jaxjob" if isinstance(value, type) else PUBLIC[name])


def _defined_names(module):
    """The classes and functions that ``module``'s own file defines."""
    with open(importlib.import_module(module).__file__) as f:
        tree = ast.parse(f.read())
    kinds = ast.ClassDef | ast.FunctionDef
    return {node.name for node in tree.body if isinstance(node, kinds)}


def test_the_package_has_no_other_modules():
    """jaxjob/ itself holds __init__.py, the public re-export modules, _src and the PEP 561
    marker py.typed only."""
    names = sorted(n for n in os.listdir(PACKAGE) if n != "__pycache__")
    modules = [m.split(".")[1] + ".py" for m in REEXPORTS]
    assert names == sorted(["__init__.py", "_src", "py.typed", *modules])


def test_the_package_is_typed_for_type_checkers():
    """jaxjob/py.typed exists and setuptools packages it (PEP 561): type checkers read jaxjob's
    annotations instead of treating it as untyped."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))
    with open(os.path.join(os.path.dirname(PACKAGE), "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["jaxjob"]


def _own_statements(module):
    """The statements of ``module``'s file that are neither its docstring nor a re-export."""
    with open(os.path.join(PACKAGE, module.split(".")[1] + ".py")) as f:
        tree = ast.parse(f.read())
    source, names = REEXPORTS[module]
    own = []
    for node in tree.body[1:]:
        reexport = (
            isinstance(node, ast.ImportFrom)
            and node.module == source
            and all(a.asname == a.name for a in node.names)
        )
        listed = isinstance(node, ast.Assign) and ast.unparse(node) == f"__all__ = {names!r}"
        if not reexport and not listed:
            own.append(ast.unparse(node))
    return own


@pytest.mark.parametrize("module", sorted(REEXPORTS))
def test_public_modules_only_reexport(module):
    """Each public module's names are its _src module's objects; it defines nothing itself."""
    public = importlib.import_module(module)
    source, names = REEXPORTS[module]
    assert public.__all__ == names
    classes = [getattr(public, n) for n in names if isinstance(getattr(public, n), type)]
    assert [c for c in classes if c.__module__ not in (module, "jaxjob")] == []
    assert all(getattr(public, n) is getattr(importlib.import_module(source), n) for n in names)
    own = _own_statements(module)
    if module == "jaxjob.cli":  # python -m jaxjob.cli runs the command
        assert own == ["import sys", "if __name__ == '__main__':\n    sys.exit(main())"]
    else:
        assert own == []


def test_the_manifest_handler_keeps_the_class_path_checkpoints_record(tmp_path):
    """Orbax records jaxjob.orbax_adapter.ManifestHandler in _CHECKPOINT_METADATA, as before."""
    import jax.numpy as jnp

    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(3)}))
    ckpt.close()
    text = (tmp_path / "local.0" / "_CHECKPOINT_METADATA").read_text()
    assert '"jaxjob.orbax_adapter.ManifestHandler"' in text
    assert text.count("jaxjob.") == 1
