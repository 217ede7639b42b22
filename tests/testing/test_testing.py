"""The fault-injection kit (jaxjob.testing) on a real job: SIGKILL at every phase, then resume.

The job is ``fault_job.py``, on one process and on two (``jaxjob launch -n 2``).
One uninterrupted run per configuration is the reference. The default tier kills
one job repeatedly (a chain: every fail point that this build of jaxjob passes,
then 5 random moments), restarting it each time; the slow tier kills 20 fresh jobs
per configuration at random moments. Each restart must resume from the newest
committed epoch, every checkpoint written afterwards must equal the reference's,
and the final workspace must be bitwise equal to the reference's.
"""

import random
import re
import shutil
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import package_files
import paths
import pytest

import jaxjob
from jaxjob import testing
from jaxjob._src.base import faults
from jaxjob._src.manager import lock

JOB = str(Path(paths.JOBS) / "fault_job.py")
SOURCE = Path(testing.__file__).parent
EPOCHS = 10


def instrumented(point):
    """Whether this build of jaxjob passes the fail point ``point`` (in its source)."""
    call = re.compile(rf"(faults\.point|FailPoint)\(\s*[\"']{re.escape(point)}[\"']")
    return any(call.search((SOURCE / f).read_text()) for f in package_files.py_files(str(SOURCE)))


def test_the_fail_point_scan_reads_every_module():
    """The source scan walks jaxjob/ recursively: a moved module cannot drop out of it."""
    assert len(package_files.py_files(str(SOURCE))) == package_files.PY_FILES


# fault_job.py has one tier: the local tier's points are killed in tests/scenarios/test_two_tiers.py
# ("history.saved", a save has returned, in tests/run/test_history.py)
PHASES = [
    p
    for p in faults.POINTS
    if instrumented(p) and not p.startswith("local.") and p != "history.saved"
]
SAVE_PHASES = ("epoch", "save.copy", "save.write", "save.commit")
ONCE_PER_RUN = ("lock.takeover",)  # a restart takes over the dead run's lock once


def committed(prefix):
    return jaxjob.CheckpointManager(str(prefix)).committed_epochs()


def argv(base):
    return [JOB, str(base / "ckpt"), str(base / "out"), str(EPOCHS)]


@pytest.fixture(scope="module", params=[1, 2], ids=["1-process", "2-processes"])
def reference(request, tmp_path_factory, compile_cache):
    """An uninterrupted run per process count: (processes, its directory, its wall time)."""
    base = tmp_path_factory.mktemp(f"reference{request.param}")
    start = time.monotonic()
    output = testing.run(argv(base), processes=request.param, env=compile_cache)
    assert "finished at epoch 10" in output
    return request.param, base, time.monotonic() - start


def test_phases_in_this_build():
    """The save's four phases and the epoch are instrumented; retention and the lock come later."""
    assert {"epoch", "save.copy", "save.write", "save.commit"} <= set(PHASES)
    local = {"local.save.copy", "local.save.write", "local.save.commit"}
    assert local <= {p for p in faults.POINTS if instrumented(p)}


def test_every_phase_then_random_kills_resume_exactly(tmp_path, reference, compile_cache):
    """Killed at every phase and at a random moment, the job resumes each time and ends exactly
    (20 more random moments per process count: the slow tier's test_random_kill_resumes_exactly)."""
    processes, ref, wall = reference
    rng = random.Random(processes)
    kills = [{"kill_at": f"{p}:{1 if p in ONCE_PER_RUN else 2}"} for p in PHASES]
    kills += [{"delay_s": rng.uniform(0.1, 0.5) * wall}]
    prefix, options = str(tmp_path / "ckpt"), {"processes": processes, "env": compile_cache}
    done = [testing.run_killed(argv(tmp_path), prefix, **kill, **options) for kill in kills]
    testing.run(argv(tmp_path), db_prefix=prefix, **options)
    for phase, kill in zip(PHASES, done, strict=False):
        assert kill.killed and kill.committed, phase
        if phase in SAVE_PHASES:  # it died in its 2nd epoch or save: one more epoch committed
            more = 0 if phase == "epoch" else 1  # (in the 2nd epoch, the 1st may still be writing)
            assert more <= kill.committed[-1] - (kill.resumed_from or 0) <= 1, phase
    compared = testing.assert_checkpoints_equal(ref / "ckpt", tmp_path / "ckpt")
    assert compared[-1] == EPOCHS and compared == committed(tmp_path / "ckpt")
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")


def test_rerunning_a_finished_job_ends_exactly(tmp_path, reference, compile_cache, request):
    """A job killed after its last commit, rerun, ends as it did: same values and shardings."""
    processes, ref, _ = reference
    shutil.copytree(ref / "ckpt", tmp_path / "ckpt")
    testing.run(argv(tmp_path), db_prefix=tmp_path / "ckpt", processes=processes, env=compile_cache)
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_random_kill_resumes_exactly(tmp_path, reference, compile_cache, seed):
    """A SIGKILL at a random moment: the restarted job resumes and ends bitwise equal."""
    processes, ref, wall = reference
    delay = random.Random(seed).uniform(0.1, 0.9) * wall
    kill = testing.kill_and_resume(
        argv(tmp_path),
        str(tmp_path / "ckpt"),
        delay_s=delay,
        processes=processes,
        env=compile_cache,
    )
    if kill.committed:  # every epoch up to the newest intact (or kept by retention)
        assert kill.committed == list(range(kill.committed[0], kill.committed[-1] + 1))
    compared = testing.assert_checkpoints_equal(ref / "ckpt", tmp_path / "ckpt")
    assert compared[-1] == EPOCHS and compared == committed(tmp_path / "ckpt")
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")


def test_kill_arguments_are_checked(tmp_path):
    """A kill names a known fail point (or a delay), once; the message lists the points."""
    with pytest.raises(ValueError, match=r"kill_at must be a fail point of \('epoch'.*got 'save'"):
        testing.run_killed([JOB], str(tmp_path), kill_at="save")
    with pytest.raises(ValueError, match=r"got 'epoch:0'"):
        testing.run_killed([JOB], str(tmp_path), kill_at="epoch:0")
    with pytest.raises(ValueError, match="give one of kill_at and delay_s"):
        testing.run_killed([JOB], str(tmp_path), kill_at="epoch", delay_s=1.0)
    with pytest.raises(ValueError, match="processes must be an int >= 1, got 0"):
        testing.run([JOB], processes=0)


def test_a_job_that_never_reaches_the_point_fails_the_check(tmp_path):
    """A job that finishes without passing kill_at is reported, with its output."""
    script = tmp_path / "plain.py"
    script.write_text("print('no checkpoints here')\n")
    with pytest.raises(AssertionError, match=r"finished without reaching 'save.write'(.|\n)*no ch"):
        testing.run_killed([str(script)], str(tmp_path / "ckpt"), kill_at="save.write")


LEAVES_A_CHILD = """
import os, subprocess, sys, time
from jaxjob._src.base import faults
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
me, n = os.environ.get("JAXJOB_PROCESS_ID", "0"), int(os.environ.get("JAXJOB_NUM_PROCESSES", 1))
with open(f"{sys.argv[1]}.{me}.tmp", "w") as f:
    f.write(str(child.pid))
os.rename(f"{sys.argv[1]}.{me}.tmp", f"{sys.argv[1]}.{me}")
while not all(os.path.exists(f"{sys.argv[1]}.{i}") for i in range(n)):
    time.sleep(0.01)  # every process has started its child
faults.point("epoch")
"""


def _gone(pid):
    """Whether ``pid`` has exited: no such process, or a zombie not reaped yet."""
    fields = lock.stat_fields(pid)
    return fields is None or fields[0] in lock.EXITED_STATES


@pytest.mark.parametrize("processes", [1, 2])
def test_a_killed_run_returns_only_once_every_process_of_the_job_exited(tmp_path, processes):
    """Processes the job started (here one per process, never waited for) are killed and gone
    when run_killed returns: a restart meets none of them."""
    script = tmp_path / "job.py"
    script.write_text(LEAVES_A_CHILD)
    kill = testing.run_killed(
        [str(script), str(tmp_path / "pid")],
        str(tmp_path / "ckpt"),
        kill_at="epoch",
        processes=processes,
        timeout_s=120,  # before: the run's output stayed open until the 600 s sleep ended
    )
    assert kill.killed
    pids = [int((tmp_path / f"pid.{i}").read_text()) for i in range(processes)]
    assert [pid for pid in pids if not _gone(pid)] == []


def test_assert_bitwise_equal_names_the_first_difference(tmp_path):
    """Values, dtypes and structure are compared; the error names the key path."""
    ws = {"a": {"w": jnp.arange(4.0)}, "n": np.int64(3)}
    testing.dump_workspace(ws, str(tmp_path))
    testing.assert_bitwise_equal(tmp_path, ws)
    with pytest.raises(AssertionError, match=r"differ at \['a'\]\['w'\] \(shard 0\)"):
        testing.assert_bitwise_equal(
            tmp_path, {"a": {"w": jnp.arange(4.0).at[3].set(-0.0)}, "n": np.int64(3)}
        )
    with pytest.raises(
        AssertionError, match=r"types, dtypes or shardings differ.*float32.* vs .*int32"
    ):
        testing.assert_bitwise_equal(tmp_path, {"a": {"w": jnp.arange(4)}, "n": np.int64(3)})
    with pytest.raises(AssertionError, match="tree structures differ"):
        testing.assert_bitwise_equal(tmp_path, {"a": [jnp.arange(4.0)], "n": np.int64(3)})
