"""`jaxjob bench DIR`: every figure beside its reference, scratch removed; mistakes."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import paths
import pytest
from children import interruptible_child

import jaxjob
from jaxjob import cli
from jaxjob._src.cli.bench_shape import leaves_like, parse_size

TINY = ["--leaves", "4", "--bytes", "256KiB", "--repeats", "1", "--step-seconds", "0.05"]
FIGURES = ["save_blocked", "save_commit", "restore", "step_with_save"]
DOCS_HEADING = "`jaxjob bench DIR [--leaves N --bytes SIZE | --like PATH] [--repeats R] [--json]`"


def _main(argv, capsys):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def _save_checkpoint(prefix):
    """A real checkpoint of varied leaves: float32, bfloat16, int32, a PRNG key, a NumPy array."""
    workspace = {
        "params": {"w": jnp.ones((3, 5)), "emb": jnp.ones((7,), jnp.bfloat16)},
        "count": jnp.zeros((2, 2), jnp.int32),
        "rng": jax.random.key(0),
        "cursor": np.arange(6, dtype=np.int64),
    }
    manager = jaxjob.CheckpointManager(str(prefix))
    manager.save(0, workspace)
    manager.close()


def test_json_reports_every_figure_beside_its_reference_and_leaves_nothing(tmp_path, capsys):
    """--json: each figure's medians are positive, ratio = jaxjob / reference; DIR is left empty."""
    status, out, err = _main(["bench", tmp_path, *TINY, "--json"], capsys)
    assert status == 0, err
    report = json.loads(out)
    assert (report["leaves"], report["bytes"], report["repeats"]) == (4, 256 * 1024, 1)
    assert list(report["figures"]) == FIGURES
    for name, row in report["figures"].items():
        assert row["jaxjob_s"] > 0 and row["reference_s"] > 0, (name, row)
        assert row["ratio"] == pytest.approx(row["jaxjob_s"] / row["reference_s"]), name
    steps = report["figures"]["step_with_save"]
    assert report["step_s"] > 0
    for who in ("jaxjob", "reference"):
        expected = 100 * (steps[f"{who}_s"] / report["step_s"] - 1)
        assert report["slowdown_pct"][who] == pytest.approx(expected)
    assert os.listdir(tmp_path) == []


def test_the_table_has_a_row_per_figure(tmp_path, capsys):
    """Without --json: a Markdown table, a row per figure with both times and the ratio."""
    status, out, err = _main(["bench", tmp_path, *TINY], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"4 leaves, 256.0 KiB, in {tmp_path} (medians of 1)")
    header = lines.index("| figure | jaxjob | reference | ratio |")
    rows = lines[header + 2 : header + 6]
    assert [r.split(" | ")[0] for r in rows] == [
        "| save: caller blocked",
        "| save: until durably committed",
        "| full restore",
        "| step with a save every step",
    ]
    assert all(r.endswith("x |") and r.count(" ms") + r.count(" s ") >= 2 for r in rows), out
    assert "%)" in rows[-1] and "step alone: " in out and "reference: a minimal writer" in out
    assert os.listdir(tmp_path) == []


def test_like_takes_the_leaves_of_a_checkpoint(tmp_path, capsys):
    """--like PATH: the workspace has a checkpoint's leaves' shapes and dtypes (keys: key data)."""
    _save_checkpoint(tmp_path / "run")
    found = sorted(
        (leaf.shape, leaf.dtype.name, leaf.host_local)
        for leaf in leaves_like(str(tmp_path / "run"))
    )
    assert found == [
        ((2,), "uint32", False),  # the PRNG key's key data
        ((2, 2), "int32", False),
        ((3, 5), "float32", False),
        ((6,), "int64", True),
        ((7,), "bfloat16", False),
    ]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    argv = [
        "bench",
        scratch,
        "--like",
        tmp_path / "run",
        "--repeats",
        "1",
        "--step-seconds",
        "0.05",
    ]
    status, out, err = _main([*argv, "--json"], capsys)
    assert status == 0, err
    report = json.loads(out)
    assert report["leaves"] == 5 and report["bytes"] == 8 + 16 + 60 + 48 + 14
    assert all(row["ratio"] > 0 for row in report["figures"].values())
    assert os.listdir(scratch) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64MiB", 64 * 2**20),
        ("1GiB", 2**30),
        ("512 kib", 512 * 1024),
        ("10MB", 10**7),
        ("4096", 4096),
    ],
)
def test_sizes_are_read_in_binary_and_decimal_units(text, expected):
    """Sizes: a number with B, KiB, MiB, GiB, TiB or KB, MB, GB, TB (any case), or a plain count."""
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench", "{tmp}", "--bytes", "64 lots"],
            "jaxjob bench: --bytes: got '64 lots'; expected a size of at least 1 byte, such as",
        ),
        (
            ["bench", "{tmp}", "--bytes", "0.5"],
            "jaxjob bench: --bytes: got '0.5'; expected a size of at least 1 byte",
        ),
        (
            ["bench", "{tmp}", "--leaves", "8", "--bytes", "16B"],
            "jaxjob bench: --bytes: got 16 bytes for 8 leaves; expected at least 4 bytes",
        ),
        (["bench", "{tmp}", "--leaves", "0"], "jaxjob bench: --leaves: got 0; expected at least 1"),
        (
            ["bench", "{tmp}", "--repeats", "0"],
            "jaxjob bench: --repeats: got 0; expected at least 1",
        ),
        (
            ["bench", "{tmp}/missing"],
            "jaxjob bench: DIR: got '{tmp}/missing', which is not an existing directory",
        ),
        (
            ["bench", "{tmp}", "--like", "{tmp}", "--leaves", "3"],
            "jaxjob bench: --like: got '{tmp}' with --leaves or --bytes; expected either --like",
        ),
        (
            ["bench", "{tmp}", "--like", "{tmp}"],
            "jaxjob bench: no checkpoint directory or db_prefix at '{tmp}'",
        ),
    ],
)
def test_a_mistake_is_one_line_on_stderr_and_exit_2(tmp_path, capsys, argv, message):
    """A bad size, leaf count or repeat count, a missing DIR, --like with --leaves: one line."""
    status, out, err = _main([a.format(tmp=tmp_path) for a in argv], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(message.format(tmp=tmp_path)), err
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any directory")
def test_a_directory_this_user_cannot_write_in_is_refused(tmp_path, capsys):
    """A DIR without write permission: one line naming it, exit 2."""
    tmp_path.chmod(0o500)
    try:
        status, _, err = _main(["bench", tmp_path, *TINY], capsys)
    finally:
        tmp_path.chmod(0o700)
    assert status == 2 and f"DIR: got '{tmp_path}'; expected a directory this user can" in err


def test_help_imports_neither_jax_nor_orbax():
    """`jaxjob bench --help` runs without importing JAX, Orbax or NumPy, and names its options."""
    script = (
        "import sys\nfrom jaxjob import cli\ntry:\n    cli.main(['bench', '--help'])\n"
        "except SystemExit as exit:\n    assert exit.code == 0\n"
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in "
        "('jax', 'jaxlib', 'orbax', 'numpy')))"
    )
    env = {**os.environ, "JAXJOB_TEST_ZYGOTE": "0"}  # a fresh interpreter
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY []" in proc.stdout
    for option in ("--leaves", "--bytes", "--like", "--repeats", "--step-seconds", "--json"):
        assert option in proc.stdout


def test_ctrl_c_removes_the_scratch_directory(tmp_path):
    """SIGINT while measuring: the saves in flight end and the scratch subdirectory is removed."""
    argv = [sys.executable, "-m", "jaxjob.cli", "bench", str(tmp_path), "--bytes", "4MiB"]
    proc = subprocess.Popen(
        [*argv, "--repeats", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible_child,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(
            os.path.isdir(os.path.join(tmp_path, d, "ckpt")) for d in os.listdir(tmp_path)
        ):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        time.sleep(0.5)  # saves under way
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err, err[-3000:]
    assert os.listdir(tmp_path) == []


def test_the_docs_example_runs(tmp_path):
    """docs/cli.md's bench cell runs as printed (beside a run at runs/mlp) and leaves nothing."""
    _save_checkpoint(tmp_path / "runs" / "mlp")
    (cell,) = paths.docs_cells("cli.md", DOCS_HEADING)
    assert cell.startswith("%%bash\n")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run(
        ["bash", "-ec", cell.removeprefix("%%bash\n")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("8 leaves, 1.0 MiB, in ") and "| full restore |" in proc.stdout
    assert lines[-1].startswith("5 leaves: {'save_blocked': ")
    assert os.listdir(tmp_path / "scratch") == []
    assert not math.isnan(json.loads((tmp_path / "bench.json").read_text())["step_s"])


@pytest.mark.parametrize("store", ["gcs_prefix", "s3_prefix"])
def test_an_object_store_prefix_is_measured_and_left_empty(store, request, capsys):
    """DIR may be gs:// or s3:// (the local object-store servers): figures, then nothing left."""
    from jaxjob._src.base import fs

    prefix = request.getfixturevalue(store)
    status, out, err = _main(["bench", prefix, *TINY, "--json"], capsys)
    assert status == 0, err
    report = json.loads(out)
    assert all(row["jaxjob_s"] > 0 and row["reference_s"] > 0 for row in report["figures"].values())
    assert fs.listdir(prefix) == []
