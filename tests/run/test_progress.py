"""Progress: one line per epoch (or a bar in a terminal), runner.history, and few log lines."""

import fcntl
import importlib.util
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import jax.numpy as jnp
import paths
import pytest

import jaxjob

SCRIPT = os.path.join(paths.JOBS, "progress_job.py")
TIMES = r"time \d+\.\d{3}s  save \d+\.\d{3}s"
LINES = [
    rf"epoch 1  loss 1\.0000  accuracy 0\.0000  {TIMES}",
    rf"epoch 2  loss 0\.5000  accuracy 0\.2500  {TIMES}",
]


def _child(*args, **kwargs):
    kwargs.setdefault("capture_output", True)
    proc = subprocess.run([sys.executable, *args], text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, (proc.stdout or "")[-2000:] + (proc.stderr or "")[-2000:]
    return proc


def test_plain_line_per_epoch_and_few_info_lines_when_not_a_terminal(tmp_path):
    """Piped stdout gets one plain line per epoch; at INFO jaxjob logs one line, Orbax none."""
    proc = _child(SCRIPT, str(tmp_path))
    lines = proc.stdout.splitlines()
    assert len(lines) == len(LINES)
    for line, pattern in zip(lines, LINES, strict=True):
        assert re.fullmatch(pattern, line), line
    logged = [line for line in proc.stderr.splitlines() if not line.startswith("INFO:jax._src")]
    assert logged == ["INFO:jaxjob.runner:Finished training at epoch 2"]


def test_orbax_info_lines_come_back_on_request(tmp_path):
    """logging.getLogger("absl").setLevel(logging.INFO) shows Orbax's INFO lines again."""
    proc = _child(SCRIPT, str(tmp_path), "absl")
    assert sum(line.startswith("INFO:absl:") for line in proc.stderr.splitlines()) > 20


def test_progress_bar_in_a_terminal(tmp_path):
    """With stdout a terminal, a tqdm bar counts epochs up to the epoch limit, with the values."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, str(tmp_path)],
        stdout=terminal,
        stderr=subprocess.DEVNULL,
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=300) == 0
    os.close(controller)
    screen = b"".join(chunks).decode()
    assert "\r" in screen
    assert re.search(rf"epoch 2: 100%.*\| 2/2 .*loss 0\.5000  accuracy 0\.2500  {TIMES}", screen)
    assert not re.search(r"^epoch 1  loss", screen, re.MULTILINE)  # no plain lines


@pytest.mark.slow  # two processes joining a jax.distributed job: ~28 s on a loaded machine
def test_only_process_zero_displays(tmp_path):
    """Under `jaxjob launch -n 2` only process 0 prints progress lines."""
    launch = ["-m", "jaxjob.cli", "launch", "-n", "2", "--", sys.executable, SCRIPT, str(tmp_path)]
    lines = [line for line in _child(*launch).stdout.splitlines() if "] epoch " in line]
    assert len(lines) == 2
    for line, pattern in zip(lines, LINES, strict=True):
        assert re.fullmatch(r"\[process=0\] " + pattern, line), line


def _job(epochs):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "loss": 10.0 - ws["x"]})
    jaxjob.epoch_limiter(job, epochs)
    return job


def test_history_keeps_values_and_times_per_epoch(tmp_path, capsys):
    """runner.history: a dict per epoch run, with the progress values as floats and the times."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    runner = jaxjob.JobRunner(_job(3), ckpt, progress=["loss", "x"])
    runner.train(jaxjob.Session())
    assert [(r["epoch"], r["loss"], r["x"]) for r in runner.history] == [
        (1, 10.0, 1.0),
        (2, 9.0, 2.0),
        (3, 8.0, 3.0),
    ]
    for record in runner.history:
        assert list(record) == ["epoch", "loss", "x", "epoch_time_s", "save_time_s"]
        assert type(record["loss"]) is float
        assert 0 < record["save_time_s"] <= record["epoch_time_s"]
    assert len(capsys.readouterr().out.splitlines()) == 3
    more = jaxjob.JobRunner(_job(4), jaxjob.CheckpointManager(str(tmp_path)), progress=["loss"])
    more.train(jaxjob.Session())
    assert more.history[:3] == runner.history  # resumed: the earlier epochs' records come back
    assert [(r["epoch"], r["loss"]) for r in more.history] == [(1, 10), (2, 9), (3, 8), (4, 7.0)]


def test_without_progress_history_keeps_times_and_nothing_prints(capsys):
    """progress=None: history has the epoch and its times only (no device sync), no output."""
    runner = jaxjob.JobRunner(_job(2))
    runner.train(jaxjob.Session())
    assert [list(r) for r in runner.history] == [["epoch", "epoch_time_s", "save_time_s"]] * 2
    assert [r["save_time_s"] for r in runner.history] == [0.0, 0.0]
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "progress, error, message",
    [
        ("loss", TypeError, r"progress must be None or a list of names .* got 'loss'"),
        (["loss", 3], TypeError, r"progress: names must be non-empty strings, got \[3\]"),
        (["loss", "epoch"], ValueError, r"progress: names \['epoch'\] are repeated or clash"),
        (["los"], KeyError, r"progress name 'los' is neither an output nor a leaf of epoch 1"),
        (["x_vec"], ValueError, r"progress name 'x_vec' must be a scalar, got .* shape \(2,\)"),
    ],
)
def test_bad_progress_names_raise(progress, error, message):
    """A bare string, a non-string, a reserved name, an unknown name or a non-scalar: an error."""
    job = _job(1)
    job.epoch_group.add(lambda ws: {"x_vec": jnp.zeros(2)})
    with pytest.raises(error, match=message):
        jaxjob.JobRunner(job, progress=progress).train(jaxjob.Session())


@pytest.mark.slow  # a kernel start: ~20 s on a loaded 2-core machine
def test_progress_in_a_jupyter_kernel(tmp_path):
    """In a Jupyter kernel: tqdm's widget with ipywidgets installed, else plain lines (no
    tqdm warning about the missing widget)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    code = f"import sys, runpy\nsys.argv = ['progress_job.py', {str(tmp_path)!r}]\n"
    code += f"sys.path.insert(0, {os.path.dirname(SCRIPT)!r})\n"  # as `python SCRIPT` would
    code += f"_ = runpy.run_path({SCRIPT!r})"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    stdout = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    if importlib.util.find_spec("ipywidgets") is None:
        assert not widgets and "IProgress" not in str(outputs)
        lines = stdout.splitlines()
        assert len(lines) == len(LINES)
        for line, pattern in zip(lines, LINES, strict=True):
            assert re.fullmatch(pattern, line), line
    else:
        assert len(widgets) == 1 and "epoch 1  loss" not in stdout


class _Writes(io.StringIO):
    """A stdout that keeps each ``write`` call apart (a Ctrl-C can only come between two)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def write(self, text):
        self.calls.append(text)
        return super().write(text)

    def isatty(self):
        return False


def test_each_plain_line_is_one_write_with_its_newline(monkeypatch):
    """A KeyboardInterrupt between two writes of a line left it open, and whatever came next
    (a log line, the caller's own output) joined it; each line is now written whole."""
    from jaxjob._src.run.progress import Progress

    out = _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    progress = Progress(["loss"], [], display=True)
    for epoch in (1, 2):
        values = progress.values(epoch, {"loss": 0.5 / epoch})
        progress.epoch_done(epoch, values, epoch_time_s=0.25, save_time_s=0.0)
    progress.close()
    lines = [call for call in out.calls if call]
    assert lines == [
        "epoch 1  loss 0.5000  time 0.250s  save 0.000s\n",
        "epoch 2  loss 0.2500  time 0.250s  save 0.000s\n",
    ]
