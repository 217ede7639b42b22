"""Workspace, tasks, groups and sessions: fusion, caching, donation and outputs."""

import ast
import doctest
import importlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import package_files
import pytest

import jaxjob


def test_workspace_is_an_immutable_pytree():
    """set/remove return new workspaces; the workspace flattens with DictKey paths."""
    ws = jaxjob.Workspace({"b": jnp.ones(2), "a": 1})
    ws2 = ws.set({"c": 3})
    assert list(ws) == ["a", "b"] and list(ws2) == ["a", "b", "c"]
    assert list(ws2.remove("a")) == ["b", "c"]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(ws)[0]]
    assert paths == ["['a']", "['b']"]
    doubled = jax.tree.map(lambda x: x * 2, ws)
    assert isinstance(doubled, jaxjob.Workspace) and doubled["a"] == 2
    with pytest.raises(KeyError, match=r"name 'z' is not in the workspace; it holds \['a', 'b'\]"):
        ws["z"]
    with pytest.raises(TypeError, match="names must be non-empty strings"):
        jaxjob.Workspace({1: 2})


def test_consecutive_jitted_tasks_fuse_and_do_not_retrace():
    """Two jitted tasks compile to one program; the second epoch does not retrace."""
    traces = []
    group = jaxjob.TaskGroup()

    @group.task
    def first(ws):
        traces.append("first")
        return {"x": ws["x"] + 1}

    @group.task
    def second(ws):
        traces.append("second")
        return {"y": ws["x"] * 2}

    session = jaxjob.Session({"x": jnp.zeros(3)})
    steps = session.steps(group)
    assert len(steps) == 1 and [t.name for t in steps[0].tasks] == ["first", "second"]
    out = session.run(group)
    n = len(traces)
    out = session.run(group)
    assert len(traces) == n
    assert out["y"].tolist() == [4.0, 4.0, 4.0]
    assert sorted(session.workspace) == ["x"]  # "y" is an output, dropped after the run


def test_host_task_splits_programs():
    """A host task between jitted ones gives three steps, run in order."""
    group = jaxjob.TaskGroup()
    group.add(lambda ws: {"x": ws["x"] + 1})
    group.add(lambda ws: {"host": np.asarray(ws["x"]).copy()}, jit=False)
    group.add(lambda ws: {"x": ws["x"] + 1})
    session = jaxjob.Session({"x": jnp.zeros(())})
    assert len(session.steps(group)) == 3
    out = session.run(group)
    assert float(out["x"]) == 2.0 and float(out["host"]) == 1.0
    assert isinstance(out["host"], np.ndarray)


def test_persistent_buffers_are_donated():
    """Overwritten persistent buffers are donated to the fused program."""
    group = jaxjob.TaskGroup()
    group.add(lambda ws: {"x": ws["x"] + 1})
    session = jaxjob.Session({"x": jnp.zeros(1000), "keep": jnp.ones(2)})
    before, keep = session.workspace["x"], session.workspace["keep"]
    session.run(group)
    assert before.is_deleted()
    assert not keep.is_deleted()


def test_task_result_must_be_a_mapping():
    """A task returning something else raises a TypeError naming the task."""
    group = jaxjob.TaskGroup(jit=False)
    group.add(lambda ws: [1], name="bad")
    with pytest.raises(TypeError, match="task 'bad' must return a mapping .* got list"):
        jaxjob.Session().run(group)


def test_job_context_and_nodes():
    """with job: adds epoch tasks; nodes are listed in first-use order."""
    with jaxjob.Job() as job:
        assert jaxjob.Job.current() is job
        jaxjob.Task(lambda ws: None)
        with jaxjob.Node("b"):
            job.init_group.add(lambda ws: {"x": 1}, jit=False)
        with jaxjob.Node("a"):
            job.init_group.add(lambda ws: {"y": 1}, jit=False)
        job.init_group.add(lambda ws: {"z": 1}, jit=False)
    assert len(job.epoch_group.tasks) == 1
    assert job.nodes_to_checkpoint() == ["b", "a", "local"]
    with pytest.raises(TypeError, match="condition must be a workspace name"):
        job.add_stop_condition(3)
    with pytest.raises(ValueError, match="num_epochs must be an integer >= 1, got 0"):
        jaxjob.epoch_limiter(job, 0)


def test_stop_condition_must_be_scalar():
    """A non-scalar stop condition raises naming the condition and shape."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "v": jnp.ones(3) > 0})
    job.add_stop_condition("v")
    with pytest.raises(ValueError, match=r"stop condition 'v' must be a scalar boolean.*\(3,\)"):
        jaxjob.JobRunner(job).train(jaxjob.Session())


MODULES = package_files.PY_FILES - 1  # every module and package under jaxjob/ but jaxjob


def _modules():
    import jaxjob as pkg

    return [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix="jaxjob.")]


def test_the_doctest_walk_sees_every_module():
    """The doctest runner walks jaxjob/ recursively: a moved module cannot drop out of it."""
    found = _modules()
    assert len(found) == MODULES, sorted(found)
    assert {"jaxjob._src.core.task", "jaxjob.keep", "jaxjob._src.base"} <= set(found)


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples_run(module):
    """Every docstring example in the package runs as written."""
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def _public_names():
    """Every public name and its path: jaxjob.X, and jaxjob.hosts.X for the public modules."""
    names = {}
    for module in ("distributed", "hosts"):
        names.update((n, f"jaxjob.{module}.{n}") for n in getattr(jaxjob, module).__all__)
    names.update((n, f"jaxjob.{n}") for n in jaxjob.__all__)
    return names


def _path_violations(test, public):
    """Public names an example uses bare, or imports through a module path (not jaxjob.X)."""
    defined, found = set(), []
    for example in test.examples:
        tree = ast.parse(example.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxjob"):
                found.append(f"from {node.module} import ...")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                defined.add(node.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in public and node.id not in defined:
                found.append(f"{node.id} (use {public[node.id]})")
            is_jaxjob = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            if is_jaxjob and node.value.id == "jaxjob" and node.attr not in jaxjob.__all__:
                found.append(f"jaxjob.{node.attr} (not a public name)")
    return found


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples_use_public_paths(module):
    """Examples reach public names as jaxjob.X (jaxjob.hosts.X), never by a module path or bare."""
    public = _public_names()
    tests = doctest.DocTestFinder().find(importlib.import_module(module))
    found = {t.name: v for t in tests if (v := _path_violations(t, public))}
    assert not found, found
