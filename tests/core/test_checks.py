"""User mistakes that used to pass silently now warn or raise, saying what to do."""

import os
import subprocess
import sys
import warnings

import jax.numpy as jnp
import numpy as np
import paths
import pytest

import jaxjob

HERE = paths.JOBS


def _job(init_names=("params",), epoch_out="params", size=3):
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        return {name: jnp.zeros(size) for name in init_names}

    @job.epoch_group.task
    def train_epoch(ws):
        return {epoch_out: ws["params"] + 1, "loss": ws["params"].sum()}

    return job


def _user_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_output_spelled_like_a_state_name_warns_once_per_run():
    """'parms' returned by an epoch task warns once, naming 'params'; 'loss' does not warn."""
    job = _job(epoch_out="parms")
    jaxjob.epoch_limiter(job, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert jaxjob.JobRunner(job).train(jaxjob.Session()) == 3
    messages = [m for m in _user_warnings(caught) if "persistent state" in m]
    assert len(messages) == 1
    assert messages[0].startswith("'parms' is not persistent state; did you mean 'params'?")
    with pytest.warns(UserWarning, match=r"'parms' is not persistent state; did you mean"):
        jaxjob.JobRunner(job).train(jaxjob.Session())


def _trained(tmp_path, job, epochs=2):
    jaxjob.epoch_limiter(job, epochs)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    assert jaxjob.JobRunner(job, ckpt).train(jaxjob.Session()) == epochs
    return ckpt


def _resume(tmp_path, job, epochs=3):
    ran = []
    job.epoch_group.add(lambda ws: ran.append(1), jit=False)
    jaxjob.epoch_limiter(job, epochs)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path)))
    try:
        runner.train(jaxjob.Session())
    finally:
        assert ran == []  # no epoch ran
        assert jaxjob.CheckpointManager(str(tmp_path)).committed_epochs() == [0, 1, 2]


@pytest.mark.parametrize(
    "saved, now, problem",
    [
        (("params",), ("params", "ema"), r"the init group creates \['ema'\], which it lacks"),
        (("params", "old"), ("params",), r"it holds \['old'\], which the init group no longer"),
    ],
)
def test_resume_with_changed_init_names_raises_before_any_epoch(tmp_path, saved, now, problem):
    """A name the init group gained or lost since the checkpoint: ValueError naming it, the
    epoch and the directory, before any epoch runs."""
    _trained(tmp_path, _job(init_names=saved))
    where = rf"epoch 2 in '{tmp_path}'"
    with pytest.raises(ValueError, match=rf"{where}: {problem}.*another db_prefix"):
        _resume(tmp_path, _job(init_names=now))


def test_resume_with_a_host_init_task_does_not_flag_its_names(tmp_path):
    """Names a host init task created (not traceable) are not reported as lost on resume."""

    def job():
        job = _job()
        job.init_group.add(lambda ws: {"cursor": np.arange(2)}, jit=False, name="cursor")
        return job

    _trained(tmp_path, job())
    jaxjob.epoch_limiter(resumed := job(), 3)
    session = jaxjob.Session()
    assert jaxjob.JobRunner(resumed, jaxjob.CheckpointManager(str(tmp_path))).train(session) == 3
    np.testing.assert_array_equal(session.workspace["cursor"], np.arange(2))
    np.testing.assert_array_equal(session.workspace["params"], np.full(3, 3.0))


def test_resume_with_a_changed_shape_names_epoch_and_directory(tmp_path):
    """A leaf whose shape changed since the checkpoint: ValueError naming path, epoch, directory."""
    _trained(tmp_path, _job())
    job = _job(size=4)
    where = rf"the checkpoint of epoch 2 at '{tmp_path}/local.2'"
    with pytest.raises(
        ValueError, match=rf"\['params'\]: shape mismatch: .*\(4,\).*\(3,\).*{where}"
    ):
        _resume(tmp_path, job)


def test_rerun_notebook_cell_replaces_the_task_with_a_warning():
    """Registering 'step' twice in a group keeps one (x = 3.0, not 6.0) and warns; lambdas add."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})

    def cell():  # a notebook cell
        @job.epoch_group.task
        def step(ws):
            return {"x": ws["x"] + 1}

        return step

    step = cell()
    with pytest.warns(UserWarning, match=r"group 'epoch' already has a task named 'step'"):
        cell()
    with pytest.warns(UserWarning, match=r"group 'epoch' already has a task named 'step'"):
        job.epoch_group.add(step, name="step")
    job.init_group.add(lambda ws: {"y": jnp.zeros(())})
    assert [t.name for t in job.epoch_group.tasks] == ["step"]
    assert [t.name for t in job.init_group.tasks] == ["<lambda>", "<lambda>"]
    jaxjob.epoch_limiter(job, 3)
    session = jaxjob.Session()
    jaxjob.JobRunner(job).train(session)
    assert float(session.workspace["x"]) == 3.0


def test_same_task_name_in_different_nodes_keeps_both():
    """A factory adding task 'init' for each node keeps one per node, without a warning."""
    job = jaxjob.Job()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for node in ("trainer_0", "trainer_1"):
            with jaxjob.Node(node):

                @job.init_group.task
                def init(ws, node=node):
                    return {f"{node}/x": jnp.zeros(())}

    assert [(t.name, t.node) for t in job.init_group.tasks] == [
        ("init", "trainer_0"),
        ("init", "trainer_1"),
    ]
    replaced = r"task named 'init' in node 'trainer_1'"
    with pytest.warns(UserWarning, match=replaced), jaxjob.Node("trainer_1"):
        job.init_group.add(init)
    assert len(job.init_group.tasks) == 2


def test_epoch_limiter_again_replaces_the_limit():
    """epoch_limiter(job, 3) after epoch_limiter(job, 2) trains 3 epochs, not 2."""
    job = _job()
    jaxjob.epoch_limiter(job, 2)
    jaxjob.epoch_limiter(job, 3)
    assert job.epoch_limit == 3
    assert jaxjob.JobRunner(job).train(jaxjob.Session()) == 3


class _Opaque:
    pass


@pytest.mark.parametrize(
    "value, kind",
    [("fast", "str"), (len, "builtin_function_or_method"), (_Opaque(), "_Opaque")],
)
def test_host_task_returning_an_uncheckpointable_leaf_raises_type_error(value, kind):
    """A host task returning a string, function or object: TypeError naming task and key path."""
    job = _job()
    job.init_group.add(lambda ws: {"cfg": {"mode": [value]}}, jit=False, name="setup")
    message = rf"task 'setup' returned a {kind} at \['cfg'\]\['mode'\]\[0\], which a checkpoint"
    with pytest.raises(TypeError, match=message):
        jaxjob.JobRunner(job).train(jaxjob.Session())


def test_jitted_task_returning_a_string_names_the_task():
    """A jitted epoch task returning a string fails at trace time naming the task and key path."""
    job = _job()
    job.epoch_group.add(lambda ws: {"status": "ok"}, name="report")
    jaxjob.epoch_limiter(job, 1)
    with pytest.raises(TypeError, match=r"task 'report' returned a str at \['status'\]"):
        jaxjob.JobRunner(job).train(jaxjob.Session())


def test_explicit_axis_mesh_trains_and_resumes_with_runner_mesh(tmp_path):
    """On 4 fake devices, jax.make_mesh's Explicit axes work through JobRunner(mesh=): reshard
    in tasks, train, resume; without mesh= JAX asks for jax.set_mesh."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    script = os.path.join(HERE, "explicit_mesh_job.py")
    proc = subprocess.run(
        [sys.executable, script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "without mesh: ValueError set_mesh" in lines
    assert "trained 2 x 8.0 params P(None,) batch P('batch', None)" in lines
    assert "resumed 3 x 12.0 params P(None,) batch P('batch', None)" in lines
