"""The Eval guide's recipes (flax NNX, flax linen, equinox) run as written and restore exactly.

They are cells of docs/guides/eval.md, which the docs build also runs, one after another.
"""

import os

import paths
import pytest

PAGE = "guides/eval.md"
HEADINGS = {"nnx": "Onto your model: Flax NNX", "linen": "Flax linen", "equinox": "Equinox"}

CHECKS = {
    "nnx": """
from flax import nnx
assert type(state) is nnx.State, type(state)
assert type(state["out"]["kernel"]) is nnx.Param
want = nnx.state(MLP(nnx.Rngs(0)))
assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), state, want))
assert logits.shape == (1, 10) and kernel.shape == (32, 10)
""",
    "linen": """
want = model.init(jax.random.key(0), x)["params"]
assert jax.tree.structure(params) == jax.tree.structure(want)
assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, want))
assert logits.shape == (1, 10)
""",
    "equinox": """
assert type(model) is eqx.nn.MLP and model.activation is jax.nn.relu
want = make()
assert eqx.tree_equal(model, want), "restored model differs"
assert logits.shape == (10,) and sorted(first) == ["model/layers/0/bias", "model/layers/0/weight"]
""",
}


def recipes():
    """The code cells of the Eval guide's recipe sections, by framework."""
    found = {}
    for heading in HEADINGS.values():
        for cell in paths.docs_cells(PAGE, heading):
            kind = "nnx" if "nnx" in cell else "linen" if "linen" in cell else "equinox"
            assert kind not in found, f"two {kind} recipes in docs/{PAGE}"
            found[kind] = cell
    return found


def test_the_eval_section_has_one_recipe_per_framework():
    """The Eval guide holds exactly the flax NNX, flax linen and equinox recipes, one cell each."""
    assert sorted(recipes()) == ["equinox", "linen", "nnx"]


@pytest.mark.parametrize("framework", ["nnx", "linen", "equinox"])
def test_eval_recipe_runs_and_restores_the_saved_model(tmp_path, monkeypatch, framework):
    """The recipe runs as written; the restored model has its framework's types and saved values."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"recipe_{framework}"}
    exec(compile(recipes()[framework], f"docs/{PAGE} ({framework})", "exec"), namespace)
    exec(CHECKS[framework], namespace)
    assert os.path.isdir(tmp_path / "runs")


def test_nnx_state_saved_with_its_variables_restores_into_the_same_types(tmp_path):
    """An nnx.State saved as is (Variables included) restores into an abstract model's state."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxjob

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"params": nnx.state(model)})
    ckpt.close()
    assert sorted(jaxjob.restore(tmp_path, leaves=["params/*"])) == [
        "params/bias",
        "params/kernel",
    ]
    graphdef, like = nnx.split(nnx.eval_shape(lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(0))))
    state = jaxjob.restore(tmp_path, target={"params": like})["params"]
    assert type(state) is nnx.State and type(state["kernel"]) is nnx.Param
    restored = nnx.merge(graphdef, state)
    x = jnp.ones((1, 3))
    assert jnp.array_equal(restored(x), model(x))
    bad = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.float16), like)
    with pytest.raises(
        ValueError, match=r"\['params'\]\['bias'\]\.value: dtype mismatch: target float16"
    ):
        jaxjob.restore(tmp_path, target={"params": bad})


def test_a_params_only_nnx_state_restores_from_a_whole_saved_state(tmp_path):
    """``nnx.state(model, nnx.Param)`` as the target reads the Params of a state saved with RNGs.

    Any other target must still match the checkpoint leaf for leaf.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxjob

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin, self.drop = nnx.Linear(3, 2, rngs=rngs), nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.lin(x))

    model = Net(nnx.Rngs(0))
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"model": nnx.state(model)})  # Params, and the dropout's RngKey and RngCount
    ckpt.close()
    fresh = Net(nnx.Rngs(1))
    like = nnx.state(nnx.eval_shape(lambda: Net(nnx.Rngs(0))), nnx.Param)
    state = jaxjob.restore(tmp_path, target={"model": like})["model"]
    assert type(state) is nnx.State and type(state["lin"]["kernel"]) is nnx.Param
    assert sorted(state["lin"]) == ["bias", "kernel"] and "drop" not in state
    nnx.update(fresh, state)
    x = jnp.ones((1, 3))
    assert jnp.array_equal(fresh.lin(x), model.lin(x))
    plain = {"lin": {"kernel": jax.ShapeDtypeStruct((3, 2), jnp.float32)}}
    with pytest.raises(ValueError, match=r"the checkpoint has leaves the target lacks .*'bias'"):
        jaxjob.restore(tmp_path, target={"model": plain})


def _nets():
    """A Net of two Linears and a Dropout (Params, RngKey, RngCount), and its variant without
    the second Linear (a dropped layer)."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs, second=True):
            self.lin = nnx.Linear(3, 2, rngs=rngs)
            self.lin2 = nnx.Linear(2, 2, rngs=rngs) if second else None
            self.drop = nnx.Dropout(0.5, rngs=rngs)

    return Net


def test_an_nnx_state_target_lacking_a_layer_names_it_even_in_restore(tmp_path):
    """Filtered or whole, an nnx.State target missing Variables of a type it holds (a dropped
    layer's Params) raises naming their key paths; only other Variable types may be left out."""
    from flax import nnx

    import jaxjob

    net = _nets()
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"model": nnx.state(net(nnx.Rngs(0)))})
    ckpt.close()
    short = nnx.eval_shape(lambda: net(nnx.Rngs(0), second=False))
    for like in (nnx.state(short), nnx.state(short, nnx.Param)):
        with pytest.raises(
            ValueError, match=r"checkpoint has leaves the target lacks \[.*\['lin2'\]\['bias'\]"
        ):
            jaxjob.restore(tmp_path, target={"model": like})
    rngs_only = nnx.state(nnx.eval_shape(lambda: net(nnx.Rngs(0))), nnx.RngState)
    state = jaxjob.restore(tmp_path, target={"model": rngs_only})["model"]
    assert sorted(state) == ["drop"] and type(state["drop"]["rngs"]["count"]) is nnx.RngCount


def test_a_job_resuming_an_nnx_state_with_a_dropped_layer_raises(tmp_path):
    """A job's resume never accepts fewer leaves than its checkpoint: an init whose nnx.State lost
    a layer (a code change) fails the resume naming the layer's key paths (DESIGN semantic 7)."""
    from flax import nnx

    import jaxjob

    net = _nets()

    def run(second):
        job = jaxjob.Job()
        job.init_group.add(lambda ws: {"model": nnx.state(net(nnx.Rngs(0), second))}, name="m")
        job.epoch_group.add(lambda ws: {"model": ws["model"]}, name="step")
        jaxjob.epoch_limiter(job, 1)
        runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path)))
        runner.train(jaxjob.Session())

    run(second=True)
    with pytest.raises(ValueError, match=r"checkpoint has leaves the target lacks \[.*'lin2'"):
        run(second=False)
