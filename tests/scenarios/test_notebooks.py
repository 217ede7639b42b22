"""The notebooks run in a fresh kernel, each in under two minutes, and show what they say."""

import os
import re
import tempfile
import time

import nbformat
import paths
import pytest
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(paths.ROOT, "notebooks")


def _execute(name):
    """Runs the notebook in a fresh kernel whose temporary directory must be empty at its end."""
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}
    )
    tmp = tempfile.mkdtemp(prefix=f"{name}-tmp-")
    client.execute(env={**os.environ, "TMPDIR": tmp})
    assert os.listdir(tmp) == [], f"{name} left {os.listdir(tmp)} in its temporary directory"
    os.rmdir(tmp)
    return nb, time.perf_counter() - start


def _text(cell):
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def _cell(nb, needle):
    return next(c for c in nb.cells if c.cell_type == "code" and needle in c.source)


@pytest.mark.timeout(300)
def test_quickstart_trains_reruns_continues_restores_and_plots():
    """quickstart: 5 epochs with progress, a rerun does nothing, a raised limit continues to 8;
    a run killed in epoch 7 and resumed plots one curve of its 12 epochs."""
    nb, seconds = _execute("quickstart.ipynb")
    assert seconds < 120
    first = _text(_cell(nb, "progress=["))
    assert re.search(r"epoch 5  loss \d\.\d{4}  accuracy 0\.\d{4}", first), first
    rerun = _text(_cell(nb, "jaxjob.JobRunner(job, ckpt).train")).strip().splitlines()
    assert rerun[-1] == "5"  # the rerun of the finished job runs no epoch, and says so:
    assert "Already finished at epoch 5: its checkpoint meets a stop condition" in rerun[-2]
    more = _text(_cell(nb, "epoch_limiter(job, 8)"))
    assert "epoch 6 " in more and more.strip().endswith("8")
    listing = _text(_cell(nb, 'jaxjob_command("ls"'))
    assert [line.split()[1] for line in listing.strip().splitlines()[1:]] == [
        str(e) for e in range(9)
    ]
    accuracy = float(re.search(r"accuracy: (0\.\d+)", _text(_cell(nb, "epoch=3"))).group(1))
    assert accuracy > 0.8
    plot = _cell(nb, "runner.history")
    assert any("image/png" in out.get("data", {}) for out in plot.outputs)
    killed = re.search(
        r"killed: True \| committed epochs: \[0, (?:\d+, )*(\d+)\]", _text(_cell(nb, "kill_at"))
    )
    assert killed and int(killed.group(1)) in (5, 6), _text(_cell(nb, "kill_at"))  # died in epoch 7
    resumed = _text(_cell(nb, "resumed.train"))
    assert f"epoch {int(killed.group(1)) + 1} " in resumed and resumed.strip().endswith("12")
    curve = _cell(nb, "resumed.history")  # epochs of both runs, in the history and the JSONL file
    assert f"history epochs: {list(range(1, 13))} | metrics.jsonl lines: 12" in _text(curve)
    assert any("image/png" in out.get("data", {}) for out in curve.outputs)


@pytest.mark.timeout(300)
def test_eval_notebook_restores_a_4_device_run_into_nnx_on_2_devices():
    """eval_partial_restore: key paths, an nnx.State target, per-leaf shardings, accuracy."""
    nb, seconds = _execute("eval_partial_restore.ipynb")
    assert seconds < 120
    assert _text(_cell(nb, "jax.device_count()")).strip() == "2"
    assert "trained on 4 devices" in _text(_cell(nb, "subprocess.run"))
    kernels = _text(_cell(nb, "params/*/kernel"))
    assert "'params/hidden/kernel': (64, 128)" in kernels and "'params/out/kernel'" in kernels
    restored = _text(_cell(nb, 'target={"params": like}, sharding='))
    assert "State Param" in restored and "spec=P(None, 'model')" in restored
    found = re.search(r"epoch 1 (0\.\d+), newest (0\.\d+)", _text(_cell(nb, "def accuracy")))
    assert float(found.group(2)) > 0.85
