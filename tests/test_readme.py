"""The README's example runs as written; so do the docs' examples that the tests run on their own
(reading a checkpoint with Orbax alone, the data loaders), and docs/contributing.md's layout tree
is generated."""

import ast
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import paths
import pytest

import jaxjob

README = os.path.join(paths.ROOT, "README.md")
CONTRIBUTING = os.path.join(paths.DOCS, "contributing.md")


def test_readme_example_runs_and_resumes(tmp_path):
    """The 20-line example trains 20 epochs; re-running it does nothing new."""
    with open(README) as f:
        text = f.read()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    code += "\nprint('LAST', last_epoch, float(params['w'][0]))\n"
    outs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stdout.split("LAST")[1].split())
    assert outs[0][0] == outs[1][0] == "20"
    assert outs[0][1] == outs[1][1]
    assert abs(float(outs[0][1]) - 1.0) < 0.05  # learns w = [1, 1, 1]


PLAIN_ORBAX_CHECKS = """
import sys
assert sys.modules.get("jaxjob") is None  # never imported: the import is blocked
import jax, jax.numpy as jnp
import flax.linen as nn


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


want = MLP().init(jax.random.key(0), jnp.ones((1, 64)))["params"]
assert jax.tree.structure(params) == jax.tree.structure(want), params
assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, want))
assert jax.random.key_impl(rng) == jax.random.key_impl(jax.random.key(1))
assert (jax.random.key_data(rng) == jax.random.key_data(jax.random.key(1))).all()
assert step == 300 and cursor.tolist() == [0, 1, 2, 3] and cursor.dtype == np.arange(4).dtype
assert sorted(flat) == ["cursor", "params/Dense_0/bias", "params/Dense_0/kernel",
                        "params/Dense_1/bias", "params/Dense_1/kernel", "rng", "step"]
assert sorted(dense_0) == ["params/Dense_0/bias", "params/Dense_0/kernel"]
assert (dense_0["params/Dense_0/kernel"] == want["Dense_0"]["kernel"]).all()
print("PLAIN ORBAX OK")
"""


def _plain_orbax_blocks():
    """docs/format.md's "Reading a checkpoint without jaxjob" cells: the job's save, the reader."""
    job, reader = paths.docs_cells("format.md", "Reading a checkpoint without jaxjob")
    return job, reader


@pytest.mark.parametrize("owner_process", [None, 0], ids=["shared", "one-process"])
def test_plain_orbax_recipe_restores_a_checkpoint_without_jaxjob(tmp_path, owner_process):
    """The recipe's Orbax reader, with jaxjob unimportable, gives back every saved leaf exactly.

    Also for a checkpoint that one process wrote alone (NumPy leaves stored as they are).
    """
    job, reader = _plain_orbax_blocks()
    if owner_process is not None:
        job = job.replace(
            'CheckpointManager("runs/plain")', 'CheckpointManager("runs/plain", owner_process=0)'
        )
        assert "owner_process=0" in job
    for code in (job, "import sys\nsys.modules['jaxjob'] = None\n" + reader + PLAIN_ORBAX_CHECKS):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PLAIN ORBAX OK" in proc.stdout


def data_examples():
    """The first code cells of docs/guides/data.md's NumPy and Grain sections."""
    numpy_cell = paths.docs_cells("guides/data.md", "NumPy arrays: `IndexCursor`")[0]
    grain_cell = paths.docs_cells("guides/data.md", "Grain")[0]
    return [numpy_cell, grain_cell]


def run_example(code, directory, epochs, monkeypatch):
    """Runs a data-loader example in ``directory`` with its epoch limit set to ``epochs``."""
    monkeypatch.chdir(directory)
    namespace = {"__name__": "readme_data"}
    code = code.replace("jaxjob.epoch_limiter(job, 5)", f"jaxjob.epoch_limiter(job, {epochs})")
    exec(compile(code, "docs/guides/data.md", "exec"), namespace)
    assert namespace["last_epoch"] == epochs
    return namespace["session"].workspace


@pytest.mark.parametrize("kind", ["numpy", "grain"])
def test_readme_data_examples_resume_where_they_stopped(tmp_path, monkeypatch, kind):
    """Each data-loader example, stopped after epoch 2 and run again to 5, ends as a 5-epoch run."""
    if kind == "grain":
        pytest.importorskip("grain")
    numpy_code, grain_code = data_examples()
    code = numpy_code if kind == "numpy" else grain_code
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference = run_example(code, tmp_path / "a", 5, monkeypatch)
    run_example(code, tmp_path / "b", 2, monkeypatch)
    resumed = run_example(code, tmp_path / "b", 5, monkeypatch)
    jaxjob.testing.assert_bitwise_equal(reference, resumed)
    assert float(jnp.abs(resumed["params"]["w"] - 1.0).max()) < 0.05  # learns w = [1, 1, 1]


PACKAGE = os.path.join(paths.ROOT, "jaxjob")


def _first_line(path):
    """The first line of a module's docstring."""
    with open(path) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def layout():
    """docs/contributing.md's tree of jaxjob/: a line per module, its docstring's first line."""
    lines = ["jaxjob/"]

    def walk(directory, depth):
        entries = sorted(
            os.listdir(directory), key=lambda n: (os.path.isdir(os.path.join(directory, n)), n)
        )
        for name in entries:
            path = os.path.join(directory, name)
            indent = "  " * depth
            if os.path.isdir(path) and name != "__pycache__":
                lines.append(
                    f"{indent}{name}/".ljust(27)
                    + " "
                    + _first_line(os.path.join(path, "__init__.py"))
                )
                walk(path, depth + 1)
            elif (
                name.endswith(".py")
                and name != "__init__.py"
                or (name == "__init__.py" and depth == 1)
            ):
                lines.append(f"{indent}{name}".ljust(27) + " " + _first_line(path))

    walk(PACKAGE, 1)
    return "\n".join(lines) + "\n"


LAYOUT = re.compile(r"## Layout\n\n```text\n(jaxjob/\n.*?)^tests/", re.S | re.M)


def test_readme_layout_lists_every_module():
    """docs/contributing.md's Layout tree is generated: ``python tests/test_readme.py`` prints it.

    ``python tests/test_readme.py --write`` puts it there.
    """
    with open(CONTRIBUTING) as f:
        text = f.read()
    block = LAYOUT.search(text).group(1)
    assert block == layout(), "docs/contributing.md's Layout must be:\n" + layout()


def write_layout() -> None:
    """Rewrites docs/contributing.md's Layout tree from the package's module docstrings."""
    with open(CONTRIBUTING) as f:
        text = f.read()
    found = LAYOUT.search(text)
    text = text[: found.start(1)] + layout() + text[found.end(1) :]
    with open(CONTRIBUTING, "w") as f:
        f.write(text)


if (
    __name__ == "__main__"
):  # prints the Layout tree; with --write, puts it into docs/contributing.md
    if sys.argv[1:] == ["--write"]:
        write_layout()
    else:
        print(layout(), end="")
