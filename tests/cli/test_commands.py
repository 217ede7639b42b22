"""The jaxjob command: ls, show, export, verify against a real run's directory; user mistakes."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import paths
import pytest

import jaxjob
from jaxjob import cli

HELP_IMPORTS = """
import sys
from jaxjob import cli
for argv in (["--help"], ["ls", "--help"], ["show", "--help"], ["export", "--help"],
             ["verify", "--help"], ["launch", "--help"]):
    try:
        cli.main(argv)
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "orbax", "numpy"))
print("HEAVY", heavy)
"""


def test_help_imports_neither_jax_nor_orbax():
    """`jaxjob --help` and every subcommand's --help run without importing JAX, Orbax or NumPy."""
    proc = subprocess.run(
        [sys.executable, "-c", HELP_IMPORTS],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAXJOB_TEST_ZYGOTE": "0"},  # a fresh interpreter (tests/zygote.py)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY []" in proc.stdout
    for command in ("ls", "show", "export", "verify", "launch"):
        assert f"{command} " in proc.stdout or f"jaxjob {command}" in proc.stdout


def test_version_prints_the_installed_version(capsys):
    """`jaxjob --version` prints the installed distribution's version and exits 0."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit:
        cli.main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxjob {version('jaxjob')}"


def test_launch_help_explains_its_options(capsys):
    """`jaxjob launch --help` says what -n and --devices-per-process do."""
    with pytest.raises(SystemExit):
        cli.main(["launch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "how many processes to start on this machine" in text
    assert "--xla_force_host_platform_device_count=M" in text


def _run_job(prefix):
    """A small real job: 12 layers, bfloat16 embeddings, adam state, a PRNG key; 2 epochs."""
    tx = optax.adam(1e-2)
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        layers = [{"w": jnp.full((4, 2), float(i)), "b": jnp.zeros(2)} for i in range(12)]
        params = {"layers": layers, "emb": jnp.ones((3, 4), jnp.bfloat16)}
        return {"params": params, "opt_state": tx.init(params), "rng": jax.random.key(0)}

    @job.epoch_group.task
    def step(ws):
        grads = jax.tree.map(jnp.ones_like, ws["params"])
        updates, opt_state = tx.update(grads, ws["opt_state"], ws["params"])
        return {"params": optax.apply_updates(ws["params"], updates), "opt_state": opt_state}

    jaxjob.epoch_limiter(job, 2)
    jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(prefix))).train(jaxjob.Session())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("run")
    _run_job(prefix)
    return prefix


def _main(argv, capsys):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_ls_lists_each_epoch_of_a_run(run_dir, capsys):
    """`jaxjob ls` prints node, epoch, committed, human size, save time and age per checkpoint."""
    status, out, _ = _main(["ls", run_dir], capsys)
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["node", "epoch", "committed", "size", "save", "age"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["local", "0", "yes"],
        ["local", "1", "yes"],
        ["local", "2", "yes"],
    ]
    assert all(re.search(r"\d+\.\d KiB +\d+\.\d\d s +\d+ s$", line) for line in lines[1:]), out
    status, out, _ = _main(["ls", "--json", run_dir], capsys)
    rows = json.loads(out)
    assert [r["epoch"] for r in rows] == [0, 1, 2] and all(r["size_bytes"] > 1024 for r in rows)


def test_ls_into_a_closed_pipe_ends_quietly(run_dir):
    """`jaxjob ls DIR | head -0`: the reader is gone before ls writes; ls exits 141 (128 +
    SIGPIPE, as a shell tool would) and prints no BrokenPipeError traceback."""
    main = "import sys; from jaxjob import cli; sys.exit(cli.main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", main, "ls", run_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before the child has written its listing
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "BrokenPipeError" not in err and "Traceback" not in err, err


def test_ls_lists_uncommitted_directories_and_reports_a_missing_one(tmp_path, capsys):
    """An in-flight save is listed as not committed; a missing DIR is one line, exit 2."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in (0, 1, 10):
        ckpt.save(epoch, {"w": jnp.ones(256)})
    ckpt.close()
    (tmp_path / "local.11.orbax-checkpoint-tmp-5").mkdir()
    status, out, _ = _main(["ls", tmp_path], capsys)
    rows = [line.split() for line in out.splitlines()]
    assert [r[:3] for r in rows[1:]] == [
        ["local", "0", "yes"],
        ["local", "1", "yes"],
        ["local", "10", "yes"],
        ["local", "11", "no"],
    ]
    assert rows[1][4] == "KiB" and rows[1][6] == "s"


def test_show_prints_each_leaf_with_shape_dtype_bytes_sharding_and_totals(run_dir, capsys):
    """`jaxjob show DB_PREFIX` describes the latest epoch's leaves, one row each, then totals."""
    status, out, _ = _main(["show", run_dir], capsys)
    lines = out.splitlines()
    assert status == 0
    assert lines[0] == f"{run_dir}/local.2: node local, epoch 2, saved by 1 process(es)"
    assert lines[1].split() == ["key", "path", "shape", "dtype", "bytes", "saved", "sharding"]
    rows = {line.split()[0]: line for line in lines[2:-1]}
    assert len(rows) == 3 * 25 + 3  # params, adam's mu and nu; count, rng, the epoch counter
    assert re.fullmatch(
        r"params/layers/3/w +\(4, 2\) +float32 +32 B +cpu:0", rows["params/layers/3/w"]
    )
    assert re.fullmatch(r"params/emb +\(3, 4\) +bfloat16 +24 B +cpu:0", rows["params/emb"])
    assert re.fullmatch(r"opt_state/0/count +\(\) +int32 +4 B +cpu:0", rows["opt_state/0/count"])
    assert re.fullmatch(r"rng +\(\) +key<fry> +8 B +cpu:0", rows["rng"])
    assert re.fullmatch(
        r"total: 78 leaves, 1\.5 KiB \(\d+\.\d KiB on disk, whole checkpoint\)", lines[-1]
    )


def test_show_selects_leaves_by_pattern_and_epoch(run_dir, capsys):
    """--leaves takes key-path patterns (repeatable); --epoch and a checkpoint directory work."""
    argv = ["show", run_dir, "--epoch", "0", "--leaves", "params/layers/1*/w", "--leaves", "rng"]
    status, out, _ = _main(argv, capsys)
    lines = out.splitlines()
    assert status == 0 and lines[0].startswith(f"{run_dir}/local.0: node local, epoch 0")
    assert [line.split()[0] for line in lines[2:-1]] == [
        "params/layers/1/w",
        "params/layers/10/w",
        "params/layers/11/w",
        "rng",
    ]
    assert lines[-1].startswith("total: 4 leaves, 104 B")
    status, out, _ = _main(["show", f"{run_dir}/local.1", "--leaves", "**/emb"], capsys)
    assert status == 0 and [line.split()[0] for line in out.splitlines()[2:-1]] == [
        "opt_state/0/mu/emb",
        "opt_state/0/nu/emb",
        "params/emb",
    ]


def _readme_read_back():
    """docs/cli.md's cell that reads an exported .npz back (its export section's Python cell)."""
    heading = "`jaxjob export PATH [--leaves PATTERN]... -o FILE.npz|FILE.safetensors`"
    (cell,) = [c for c in paths.docs_cells("cli.md", heading) if not c.startswith("%%")]
    return cell


def _read_npz(file):
    """An exported .npz read back by docs/cli.md's cell: the arrays, and the record."""
    namespace = {"np": np, "json": json, "jnp": jnp, "jax": jax}
    exec(_readme_read_back().replace('"params.npz"', repr(str(file))), namespace)
    return namespace["arrays"], namespace["info"]


def test_export_npz_keys_are_key_paths_keeping_bfloat16_bits_and_prng_impls(
    run_dir, tmp_path, capsys
):
    """`jaxjob export -o FILE.npz`: an array per key path; bfloat16 as its bits, PRNG key data."""
    out_file = tmp_path / "params.npz"
    argv = ["export", run_dir, "--leaves", "params", "--leaves", "rng", "-o", out_file]
    status, out, _ = _main(argv, capsys)
    assert status == 0 and f"wrote 26 arrays, 512 B, to {out_file}" in out
    assert "stored as their bits (unsigned ints), dtype in the entry '__jaxjob__': " in out
    assert "params/emb (bfloat16)" in out and "rng (threefry2x32)" in out
    with np.load(out_file) as data:
        assert data["params/emb"].dtype == np.uint16 and data["rng"].dtype == np.uint32
    arrays, info = _read_npz(out_file)
    assert info == {"dtype": {"params/emb": "bfloat16"}, "prng_impl": {"rng": "threefry2x32"}}
    saved = jaxjob.restore(run_dir, leaves=["params", "rng"])
    assert sorted(arrays) == sorted(
        ["params/emb", "rng"] + [f"params/layers/{i}/{k}" for i in range(12) for k in "bw"]
    )
    np.testing.assert_array_equal(arrays["params/layers/7/w"], saved["params"]["layers"][7]["w"])
    assert arrays["params/emb"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(arrays["params/emb"], saved["params"]["emb"])
    assert jax.random.key_impl(arrays["rng"]) == jax.random.key_impl(saved["rng"])
    assert (jax.random.key_data(arrays["rng"]) == jax.random.key_data(saved["rng"])).all()


def test_export_npz_without_such_leaves_has_no_record(run_dir, tmp_path, capsys):
    """An export of float32 leaves only is plain: no ``__jaxjob__`` entry, no note printed."""
    out_file = tmp_path / "w.npz"
    status, out, _ = _main(
        ["export", run_dir, "--leaves", "params/layers/0", "-o", out_file], capsys
    )
    assert status == 0 and out == f"wrote 2 arrays, 40 B, to {out_file}\n"
    with np.load(out_file) as data:
        assert sorted(data) == ["params/layers/0/b", "params/layers/0/w"]


def test_export_safetensors_keeps_bfloat16_and_records_prng_impls(run_dir, tmp_path, capsys):
    """`jaxjob export -o FILE.safetensors` keeps bfloat16; a PRNG key: key data, impl recorded."""
    safetensors = pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    out_file = tmp_path / "emb.safetensors"
    argv = ["export", run_dir, "--leaves", "params/emb", "--leaves", "rng", "-o", out_file]
    status, out, _ = _main(argv, capsys)
    assert status == 0 and "wrote 2 arrays" in out
    assert "PRNG keys as their key data, implementation in the metadata key 'jaxjob': rng" in out
    data = load_file(str(out_file))
    assert str(data["params/emb"].dtype) == "bfloat16" and data["rng"].dtype == np.uint32
    with safetensors.safe_open(str(out_file), framework="np") as f:
        info = json.loads(f.metadata()["jaxjob"])
    assert info == {"prng_impl": {"rng": "threefry2x32"}}
    rng = jaxjob.restore(run_dir, leaves=["rng"])["rng"]
    np.testing.assert_array_equal(data["rng"], np.asarray(jax.random.key_data(rng)))


@pytest.fixture(scope="module")
def nnx_dir(tmp_path_factory):
    """A checkpoint of a flax NNX model's whole state (Variables: key paths end in /value)."""
    nnx = pytest.importorskip("flax.nnx")
    prefix = tmp_path_factory.mktemp("nnx")
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    ckpt = jaxjob.CheckpointManager(str(prefix))
    ckpt.save(0, {"params": nnx.state(model), "rng": jax.random.key(1, impl="rbg")})
    ckpt.close()
    return prefix


def test_export_strip_nnx_value_drops_the_value_suffix(nnx_dir, tmp_path, capsys):
    """`--strip-nnx-value` writes params/kernel for params/kernel/value; rbg keys keep impl."""
    plain, stripped = tmp_path / "plain.npz", tmp_path / "stripped.npz"
    assert _main(["export", nnx_dir, "-o", plain], capsys)[0] == 0
    assert _main(["export", nnx_dir, "--strip-nnx-value", "-o", stripped], capsys)[0] == 0
    with np.load(plain) as data:
        assert sorted(data) == ["__jaxjob__", "params/bias/value", "params/kernel/value", "rng"]
    arrays, info = _read_npz(stripped)
    assert sorted(arrays) == ["params/bias", "params/kernel", "rng"]
    assert info == {"prng_impl": {"rng": "rbg"}}
    assert jax.random.key_impl(arrays["rng"]) == jax.random.key_impl(jax.random.key(1, impl="rbg"))
    saved = jaxjob.restore(nnx_dir, leaves=["params/kernel"])["params/kernel"]
    np.testing.assert_array_equal(arrays["params/kernel"], saved["value"])


def test_export_strip_nnx_value_refuses_two_leaves_on_one_key(tmp_path, capsys):
    """Stripping /value from w/value when w exists too is one line naming both, exit 2."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.ones(1), "w/value": jnp.zeros(1)})  # the name w/value, not a Variable
    ckpt.close()
    status, out, err = _main(
        ["export", tmp_path, "--strip-nnx-value", "-o", tmp_path / "x.npz"], capsys
    )
    assert status == 2 and out == ""
    assert err.startswith(
        "jaxjob export: the leaf w/value would be exported as 'w', which another leaf"
    ), err


def test_verify_passes_an_intact_run(run_dir, capsys):
    """`jaxjob verify DB_PREFIX` checks every committed checkpoint: one ok line each, exit 0."""
    status, out, _ = _main(["verify", run_dir], capsys)
    assert status == 0
    assert out.splitlines() == [f"ok  {run_dir}/local.{e}" for e in range(3)]


def test_verify_names_each_damaged_leaf_and_exits_1(run_dir, tmp_path, capsys):
    """Truncated data files: a line per leaf naming its key path, a line per file no leaf reads."""
    copy = tmp_path / "local.2"
    shutil.copytree(run_dir / "local.2", copy)
    for data_file in (copy / "state").glob("**/d/*"):  # OCDBT's b-tree nodes and data
        data_file.write_bytes(data_file.read_bytes()[:40])
    status, out, _ = _main(["verify", copy], capsys)
    lines = out.splitlines()
    assert status == 1 and lines[-1] == "1 damaged checkpoint(s)"
    _, table, _ = _main(["show", run_dir], capsys)
    every_leaf = [line.split()[0] for line in table.splitlines()[2:-1]]
    leaf = rf"leaf (\S+) \(\[[^)]*\) of epoch 2 in '{copy}/state.*unreadable"
    named = [m for line in lines[:-1] if (m := re.match(leaf, line))]
    assert [m.group(1) for m in named] == every_leaf
    # the per-process B-tree files that the merged database replaced: read by no leaf
    unread = rf"the checkpoint of epoch 2 at '{copy}' is corrupt: the data file '{copy}/state/\S+"
    others = [line for line in lines[:-1] if not re.match(leaf, line)]
    assert others and all(re.match(unread + r"' has 40 bytes, not the \d+", x) for x in others)


def test_verify_gives_the_python_verdict_on_another_runs_epoch(run_dir, tmp_path, capsys):
    """Another run's epoch copied into the prefix: the command refuses it as verify() does."""
    from jaxjob._src.checkpoint import verify

    prefix, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(run_dir, prefix)
    ckpt = jaxjob.CheckpointManager(str(other))
    ckpt.save(3, {"w": jnp.ones(2)})
    ckpt.close()
    shutil.copytree(other / "local.3", prefix / "local.3")
    (line,) = verify.verify(prefix)
    assert "copied from another run" in line
    for path in (prefix, prefix / "local.3"):  # the prefix, and the directory inside it
        status, out, _ = _main(["verify", path], capsys)
        assert status == 1 and [x for x in out.splitlines() if not x.startswith("ok  ")] == [
            line,
            "1 damaged checkpoint(s)",
        ]


def test_verify_reports_a_missing_commit_marker_and_a_broken_manifest(run_dir, tmp_path, capsys):
    """No commit marker, or a manifest that is not JSON, is one line each; exit 1."""
    unmarked, broken = tmp_path / "a" / "local.1", tmp_path / "b" / "local.1"
    shutil.copytree(run_dir / "local.1", unmarked)
    shutil.copytree(run_dir / "local.1", broken)
    (unmarked / "commit_success.txt").unlink()
    (broken / "jaxjob" / "manifest.json").write_text("{not json")
    status, out, _ = _main(["verify", unmarked], capsys)
    assert status == 1 and out.splitlines()[0] == (
        f"{unmarked}: not committed (no commit marker): an interrupted or unfinished save"
    )
    status, out, _ = _main(["verify", broken], capsys)
    assert status == 1 and out.startswith(
        f"the checkpoint of epoch 1 at '{broken}' is corrupt: the manifest '{broken}/jaxjob/"
    )
    assert "is not valid JSON" in out.splitlines()[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ls", "{missing}"], "jaxjob ls: no checkpoint directories under '{missing}'"),
        (["show", "{missing}"], "jaxjob show: no checkpoint directory or db_prefix at '{missing}'"),
        (["verify", "{missing}"], "jaxjob verify: no checkpoint directories under '{missing}'"),
        (
            ["show", "{run}", "--epoch", "9"],
            "jaxjob show: epoch 9 is not committed for nodes ['local'] under '{run}'; "
            "committed epochs: [0, 1, 2]",
        ),
        (
            ["export", "{run}", "--epoch", "9", "-o", "{out}.npz"],
            "jaxjob export: epoch 9 is not committed",
        ),
        (["show", "{run}", "--node", "trainer"], "jaxjob show: no epoch of nodes ['trainer']"),
        (
            ["show", "{run}", "--leaves", "parms"],
            "jaxjob show: leaves ['parms'] match nothing in the checkpoint at '{run}/local.2'; "
            "close key paths: ['params'",
        ),
        (
            ["export", "{run}", "--leaves", "params/layer/1", "-o", "{out}.npz"],
            "jaxjob export: leaves ['params/layer/1'] match nothing",
        ),
        (
            ["export", "{run}", "-o", "{out}.txt"],
            "jaxjob export: output must end in .npz or .safetensors, got '{out}.txt'",
        ),
        (
            ["show", "{run}/local.1", "--epoch", "1"],
            "jaxjob show: path '{run}/local.1' is one checkpoint directory",
        ),
    ],
)
def test_a_user_mistake_is_one_line_on_stderr_and_exit_2(run_dir, tmp_path, capsys, argv, message):
    """Missing directories, unknown epochs or nodes, patterns matching nothing: one line, exit 2."""
    names = {"missing": tmp_path / "missing", "run": run_dir, "out": tmp_path / "out"}
    status, out, err = _main([a.format(**names) for a in argv], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(message.format(**names)), err


def test_the_command_runs_as_a_program_without_a_traceback(run_dir, tmp_path):
    """`python -m jaxjob.cli show` prints the table; a mistake prints one stderr line, exit 2."""
    ok = subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "show", str(run_dir), "--leaves", "rng"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0 and "rng " in ok.stdout and "total: 1 leaves" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "verify", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.count("\n") == 1, bad.stderr
    assert textwrap.dedent(bad.stderr).startswith("jaxjob verify: no checkpoint directories")
