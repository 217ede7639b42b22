"""Lineage: an epoch of another run is refused everywhere, whatever was deleted beside it.

A run's prefix holds epochs 0-2; another run's epoch 3 is copied in. With the run file, or
without it (the metadata log, then the manifests, say which run the prefix is), auto-resume,
``restore`` (of the prefix and of the directory) and ``verify`` (Python and the command) refuse
epoch 3; with nothing left to decide between the runs, resuming refuses instead of guessing.
"""

import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import paths
import pytest

import jaxjob
from jaxjob import cli, testing
from jaxjob._src.checkpoint import manifest, run_identity, verify
from jaxjob._src.run import resume


def _job(epochs, start):
    """x starts at ``start`` and counts the epochs: each run's values its own."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.full((), start, jnp.float32)}, name="init")
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1}, name="count")
    jaxjob.epoch_limiter(job, epochs)
    return job


def _train(prefix, epochs, start=0):
    session, ckpt = jaxjob.Session(), jaxjob.CheckpointManager(prefix)
    try:
        last = jaxjob.JobRunner(_job(epochs, start), ckpt).train(session)
    finally:
        ckpt.close()
    return last, float(session.workspace["x"])


@pytest.fixture
def mixed(tmp_path):
    """``(prefix, run)``: epochs 0-2 of one run, and epoch 3 copied from another run."""
    mine, other = str(tmp_path / "mine"), str(tmp_path / "other")
    _train(mine, 2)
    _train(other, 3, start=100)
    shutil.copytree(os.path.join(other, "local.3"), os.path.join(mine, "local.3"))
    return mine, run_identity.read(mine)


def _cli_verify(path, capsys):
    status = cli.main(["verify", str(path)])
    return status, capsys.readouterr().out.splitlines()


def _remove(prefix, what):
    if what == "the run file":
        os.remove(run_identity.run_file(prefix))
    else:
        shutil.rmtree(os.path.join(prefix, run_identity.RUN_DIR))


@pytest.mark.parametrize("what", ["the run file", "the .jaxjob folder"])
def test_another_runs_epoch_is_refused_without_the_run_file(mixed, what, capsys):
    """The metadata log names the run: restore, verify (both) refuse 3; resume goes on from 2."""
    prefix, run = mixed
    _remove(prefix, what)
    foreign = rf"it was saved by run [0-9a-f]{{32}}, but '{prefix}' is run {run} \(the metadata log"
    with pytest.raises(jaxjob.CorruptCheckpointError, match=foreign):
        jaxjob.restore(prefix)
    with pytest.raises(jaxjob.CorruptCheckpointError, match=foreign):
        jaxjob.restore(os.path.join(prefix, "local.3"))
    assert jaxjob.restore(prefix, epoch=2)["x"] == 2.0
    (line,) = verify.verify(prefix)
    assert "local.3" in line and "copied from another run" in line
    status, out = _cli_verify(prefix, capsys)
    assert status == 1 and [x for x in out if not x.startswith("ok  ")][:-1] == [line]
    assert _train(prefix, 4) == (4, 4.0)  # resumed from 2, not from the other run's 103
    assert run_identity.read(prefix) == run  # the run file re-created from the evidence
    assert verify.verify(prefix) == []


def test_checkpoints_of_two_runs_with_nothing_to_decide_refuse_to_resume(mixed, capsys):
    """No run file, no log: the manifests name two runs; nothing resumes, nothing is guessed."""
    prefix, run = mixed
    _remove(prefix, "the .jaxjob folder")
    os.remove(os.path.join(prefix, run_identity.LOG_FILE))
    named = rf"saved by 2 runs \(run [0-9a-f]{{32}}: \['local.3'\]; run {run}: \['local.2', "
    with pytest.raises(ValueError, match=named + r".*jaxjob does not guess. Move the"):
        jaxjob.restore(prefix)
    with pytest.raises(ValueError, match=named):
        _train(prefix, 4)
    lines = verify.verify(prefix)
    assert len(lines) == 4 and all("jaxjob does not guess" in x for x in lines)
    status, out = _cli_verify(prefix, capsys)
    assert status == 1 and out[:-1] == lines
    assert sorted(os.listdir(prefix)) == ["local.0", "local.1", "local.2", "local.3"]


def test_a_prefix_with_one_run_left_adopts_it_without_its_files(mixed):
    """The foreign epoch moved out again: the manifests agree, the run file comes back as it was."""
    prefix, run = mixed
    _remove(prefix, "the .jaxjob folder")
    os.remove(os.path.join(prefix, run_identity.LOG_FILE))
    shutil.rmtree(os.path.join(prefix, "local.3"))
    assert run_identity.evidence(prefix)[0] == run
    assert _train(prefix, 3) == (3, 3.0)
    assert run_identity.read(prefix) == run


def test_a_directory_inside_a_prefix_is_checked_against_its_run(mixed, tmp_path):
    """restore(dir) of the copied epoch inside the prefix refuses; copied out, it restores."""
    prefix, _ = mixed
    with pytest.raises(jaxjob.CorruptCheckpointError, match=r"copied from another run"):
        jaxjob.restore(os.path.join(prefix, "local.3"))
    assert jaxjob.restore(os.path.join(prefix, "local.2"))["x"] == 2.0
    alone = tmp_path / "elsewhere" / "local.3"
    shutil.copytree(os.path.join(prefix, "local.3"), alone)
    assert jaxjob.restore(str(alone))["x"] == 103.0
    assert verify.verify(str(alone)) == []


# ---- two tiers, three lives ----------------------------------------------------------------------

TIER_JOB = os.path.join(paths.JOBS, "tier_job.py")


def _launch(args, *, killed=False):
    """tier_job.py on 2 processes of 2 devices each (``jaxjob launch``); its output."""
    command = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2"]
    command += ["--devices-per-process", "2", "--", sys.executable, TIER_JOB, *map(str, args)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert (proc.returncode != 0) == killed, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return output


def _three_lives(tmp_path):
    """Life 1 dies; in life 2 host B is replaced by C (an empty local disk), the job computes
    other values and dies; in life 3 B is back with life 1's copies of local epochs 6 and 7.
    Returns ``(life 3's output, its final workspace file)``."""
    ckpt, local, out = tmp_path / "ckpt", tmp_path / "local", tmp_path / "out"
    args = [ckpt, f"{local}/{{process}}", out]
    _launch([*args, "--kill-in-epoch", 8], killed=True)  # life 1: local 6, 7 on both; durable 4
    shutil.move(local / "1", tmp_path / "host_b")  # B leaves; C comes with an empty disk
    _launch([*args, "--kill-in-epoch", 8, "--shift", 1.0], killed=True)  # life 2
    shutil.rmtree(local / "1")
    shutil.move(tmp_path / "host_b", local / "1")  # B is back, with life 1's 6 and 7
    return _launch(args), out


def test_processes_never_resume_local_copies_of_two_lives(tmp_path):
    """The local epochs 6 and 7 of the two processes come from different lives: both resume
    from the persistent epoch 4, saying why."""
    output, _ = _three_lives(tmp_path)
    lines = [x for x in output.splitlines() if "Resuming from epoch" in x]
    assert len(lines) == 2 and all("epoch 4 of the persistent tier" in x for x in lines), lines
    assert "local epoch 7: the processes' copies come from different lives" in lines[0]
    assert "local epoch 6: the processes' copies come from different lives" in lines[0]


@pytest.mark.slow
def test_three_lives_end_with_the_values_of_an_uninterrupted_run(tmp_path):
    """After the three lives above, the job's final workspace is bitwise an uninterrupted run's."""
    _, out = _three_lives(tmp_path)
    _launch([tmp_path / "ref", f"{tmp_path}/ref_local/{{process}}", tmp_path / "ref_out"])
    testing.assert_bitwise_equal(tmp_path / "ref_out", out)


def _tiered(prefix, local, epochs):
    """A counting job over two tiers (local every epoch, persistent every 4th); its manager."""
    ckpt = jaxjob.CheckpointManager(prefix, local=jaxjob.LocalTier(local))
    try:
        jaxjob.JobRunner(_job(epochs, 0), ckpt, save_every_epochs=4).train(jaxjob.Session())
    finally:
        ckpt.close()
    return ckpt


def test_each_life_records_itself_and_the_epoch_it_resumed_from(tmp_path):
    """Both tiers' manifests name the life that saved them and the epoch it resumed from."""
    prefix, local = str(tmp_path / "ckpt"), str(tmp_path / "local")
    _tiered(prefix, local, 3)  # persistent 0 and 3, local 1 and 2
    ckpt = _tiered(prefix, local, 6)  # resumed from 3: local 4 and 5, persistent 6
    read = lambda where, e: manifest.read(os.path.join(where, f"local.{e}"))  # noqa: E731
    first, second = read(prefix, 0), read(prefix, 6)
    assert (first.resumed_from, second.resumed_from) == (None, 3)
    assert read(prefix, 3).life == first.life != second.life == read(local, 5).life
    assert read(local, 5).resumed_from == 3 and sorted(os.listdir(local)) == ["local.4", "local.5"]
    found = ckpt.tier("local").lineage([4, 5])
    assert [found[e]["life"] for e in (4, 5)] == [second.life] * 2
    assert "['x'] of node 'local'" in found[5]["whole"]  # one device: every array is whole
    assert found[4]["whole"] != found[5]["whole"]  # x counts the epochs


def test_local_copies_count_only_if_one_life_saved_them_with_equal_replicated_leaves():
    """Copies of one epoch from two lives, or whose replicated leaves differ, are not resumed."""
    life = {"life": "a" * 32, "whole": {"['rng']": 7, "['step']": 1}}
    assert resume._mixed_lineage([life, dict(life)]) is None
    other = {**life, "life": "b" * 32}
    assert "come from different lives" in resume._mixed_lineage([life, other])
    changed = {**life, "whole": {"['rng']": 8}}
    why = resume._mixed_lineage([life, changed])
    assert why == "its replicated leaf \"['rng']\" differs between the processes (CRC-32C [7, 8])"
    assert "does not read on processes [1]" in resume._mixed_lineage([life, None])
