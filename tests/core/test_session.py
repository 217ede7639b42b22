"""Workspace, tasks, groups and sessions: fusion, caching, donation and outputs."""

import jax
import jax.numpy as jnp
import numpy as np
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


def test_an_interrupt_after_a_donation_leaves_live_arrays_in_the_workspace():
    """A host task interrupted after a program donated the workspace's buffers: the session
    holds the program's live results (``partial``), never the donated buffers."""
    init = jaxjob.TaskGroup(persistent=True)
    init.add(lambda ws: {"w": jnp.arange(4.0)})
    step = jaxjob.TaskGroup()
    step.add(lambda ws: {"w": ws["w"] + 1})

    def interrupted(ws):
        raise KeyboardInterrupt

    step.add(interrupted, jit=False)
    session = jaxjob.Session()
    session.run(init)
    before = session.workspace["w"]
    with pytest.raises(KeyboardInterrupt):
        session.run(step)
    np.testing.assert_array_equal(np.asarray(session.workspace["w"]), np.arange(4.0) + 1)
    assert before.is_deleted() and session.partial
    session.run(init)
    assert not session.partial
