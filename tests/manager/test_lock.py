"""One writer per node and directory: the lock, its takeover, and sharing it within a job."""

import dataclasses
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import paths
import pytest
from lock_racer import Racer, namespaces_work

import jaxjob
import jaxjob._src.checkpoint.listing
import jaxjob._src.checkpoint.verify
import jaxjob.cli
from jaxjob._src.base import faults, fs
from jaxjob._src.manager import lock

SCRIPT = os.path.join(paths.JOBS, "long_job.py")


def _lock_file(db_prefix):
    return db_prefix / ".jaxjob" / "local.lock"


def _write_record(path, **changes):
    path.parent.mkdir(exist_ok=True)
    holder = dataclasses.replace(lock.Holder.me(), **changes)
    path.write_text(json.dumps(dataclasses.asdict(holder)))
    return holder


def _record(path):
    """The lock record, read under the lock file's flock as the lock itself reads it.

    The holder rewrites the record in place (truncate, write) under an exclusive flock while it
    renews its lease, so a read without the flock may see an empty file.
    """
    if not path.exists():
        return None
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        return json.loads(f.read())


def test_a_live_holder_on_another_host_makes_init_fail_naming_it(tmp_path):
    """A lease renewed just now by another host: init raises CheckpointInUseError naming it."""
    _write_record(_lock_file(tmp_path), host="node-7", pid=4242, started=0.0)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    with pytest.raises(
        jaxjob.CheckpointInUseError,
        match=r"another writer \(host 'node-7', pid 4242, started 1970-01-01 00:00:00 UTC\)",
    ):
        ckpt.init()
    with pytest.raises(jaxjob.CheckpointInUseError, match="node-7"):
        ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
    assert sorted(os.listdir(tmp_path)) == [".jaxjob"]  # nothing written but the lock


@pytest.mark.parametrize(
    "stale",
    [
        {"host": "node-7", "renewed": time.time() - lock.LEASE_S - 5},  # lease expired
        {"pid": 2**22 + 17},  # same host, no such pid
        {"pid_start": "1"},  # same host, the pid now belongs to another process
    ],
)
def test_a_dead_holders_lock_is_taken_over(tmp_path, stale, caplog):
    """A holder whose lease lapsed or whose pid is gone is taken over, with one INFO line."""
    caplog.set_level("INFO", logger="jaxjob")
    pid = stale.get("pid", os.getppid() if "pid_start" in stale else os.getpid())
    _write_record(_lock_file(tmp_path), **{**stale, "pid": pid})
    ckpt = jaxjob.CheckpointManager(str(tmp_path), async_save=False)
    ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
    assert "Taking over the lock" in caplog.text
    record = _record(_lock_file(tmp_path))
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    ckpt.close()
    assert not _lock_file(tmp_path).exists()  # released


def _zombie():
    """A child killed by SIGKILL and not reaped yet: state Z in /proc, kill(pid, 0) succeeds."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    start = lock.pid_start(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (lock.stat_fields(child.pid) or ["?"])[0] != "Z":
        assert time.monotonic() < deadline, f"pid {child.pid} did not become a zombie"
        time.sleep(0.01)
    os.kill(child.pid, 0)  # still "exists" for a signal check: the old liveness test
    return child, start


def test_a_zombie_holders_lock_is_taken_over_at_once(tmp_path, caplog):
    """A holder killed but not yet reaped (a zombie) is dead: its lock is taken over at once."""
    caplog.set_level("INFO", logger="jaxjob")
    child, start = _zombie()
    try:
        _write_record(_lock_file(tmp_path), pid=child.pid, pid_start=start)
        ckpt = jaxjob.CheckpointManager(str(tmp_path), async_save=False)
        ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
        assert f"pid {child.pid}" in caplog.text and "Taking over the lock" in caplog.text
        assert _record(_lock_file(tmp_path))["pid"] == os.getpid()
        ckpt.close()
    finally:
        child.wait()  # reaped only now


def test_the_lock_lies_outside_the_node_names(tmp_path):
    """Under a live writer's db_prefix, glob("<node>.*") finds only epoch directories.

    Listing, ls, verify, restore and retention ignore the lock folder; it is
    removed with the last node's lock.
    """
    import glob

    a = jaxjob.CheckpointManager(str(tmp_path), "a", async_save=False, keep=jaxjob.keep.Last(2))
    b = jaxjob.CheckpointManager(str(tmp_path), "b", async_save=False)
    for epoch in range(3):
        a.save(epoch, jaxjob.Workspace({"w": jnp.full(2, epoch)}))
    b.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
    assert _record(tmp_path / ".jaxjob" / "a.lock")["pid"] == os.getpid()  # both live
    assert _record(tmp_path / ".jaxjob" / "b.lock")["pid"] == os.getpid()
    assert sorted(glob.glob(f"{tmp_path}/a.*")) == [f"{tmp_path}/a.1", f"{tmp_path}/a.2"]
    assert glob.glob(f"{tmp_path}/b.*") == [f"{tmp_path}/b.0"]
    assert sorted(os.listdir(tmp_path)) == [".jaxjob", "a.1", "a.2", "b.0"]
    rows = jaxjob._src.checkpoint.listing.list_checkpoints(str(tmp_path))
    assert [(r.node, r.epoch) for r in rows] == [("a", 1), ("a", 2), ("b", 0)]
    assert jaxjob._src.checkpoint.verify.verify(str(tmp_path)) == []
    assert jaxjob.cli.main(["ls", str(tmp_path)]) == 0
    np.testing.assert_array_equal(jaxjob.restore(str(tmp_path), node_name="a")["w"], [2, 2])
    a.close()
    assert sorted(os.listdir(tmp_path / ".jaxjob")) == ["b.lock", "run.json"]  # b's lock stays
    b.close()
    assert sorted(os.listdir(tmp_path)) == [".jaxjob", "a.1", "a.2", "b.0"]
    assert os.listdir(tmp_path / ".jaxjob") == ["run.json"]  # the locks went; the run id stays


def test_managers_of_one_process_share_the_lock_and_reading_needs_none(tmp_path):
    """A re-created manager in the same process does not block itself; readers never lock."""
    first = jaxjob.CheckpointManager(str(tmp_path), async_save=False)
    first.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
    second = jaxjob.CheckpointManager(str(tmp_path), async_save=False)  # a re-run notebook cell
    second.save(1, jaxjob.Workspace({"w": jnp.zeros(2)}))
    first.close()
    assert _record(_lock_file(tmp_path))["pid"] == os.getpid()  # second still holds it
    second.close()
    assert not _lock_file(tmp_path).exists()
    _write_record(_lock_file(tmp_path), host="node-7")  # a live writer elsewhere
    np.testing.assert_array_equal(jaxjob.restore(str(tmp_path), leaves=["w"])["w"], [0.0, 0.0])
    np.testing.assert_array_equal(jaxjob.CheckpointManager(str(tmp_path)).load(0)["w"], [1, 1])


def test_the_holder_renews_its_lease_in_the_background(tmp_path):
    """The lease's renewal time advances while the lock is held, and stops on release."""
    held = lock.WriterLock(str(tmp_path), "local", lease_s=0.4)
    held.take()
    first = _record(_lock_file(tmp_path))["renewed"]
    time.sleep(0.6)
    renewed = _record(_lock_file(tmp_path))["renewed"]
    held.release()
    assert renewed > first
    assert not _lock_file(tmp_path).exists()


def test_a_deleted_directory_loses_the_lock_once_and_stops_renewing(tmp_path):
    """A held lock whose directory is deleted is marked lost once; renewal stops retrying."""
    directory = tmp_path / "run"
    directory.mkdir()
    held = lock.WriterLock(str(directory), "local", lease_s=0.2)
    held.take()
    fs.rmtree(str(directory))
    deadline = time.monotonic() + 10
    while held.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held.lost is not None and "vanished" in held.lost and "local.lock" in held.lost
    held._thread.join(2)
    assert not held._thread.is_alive()
    held.release()


def _wait(condition, timeout_s=10):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.skipif(
    not namespaces_work(),
    reason="unshare --user --pid is not permitted here (test_lock_record.py's crafted records "
    "of another namespace cover the rule)",
)
def test_a_holder_in_another_pid_namespace_keeps_the_lock_until_its_lease_lapses(tmp_path):
    """Same host name, another PID namespace (a container): refused while its lease is renewed,
    even though its pid is dead or another process here; taken once the lease lapsed."""
    lease_s = 1.0
    holder = Racer(namespace=True)
    try:
        assert holder.pidns != os.readlink("/proc/self/ns/pid")
        assert holder.ask(f"take {tmp_path} 0 {lease_s}").startswith("won ")
        record = _record(_lock_file(tmp_path))
        assert (record["host"], record["pidns"]) == (socket.gethostname(), holder.pidns)
        assert lock.pid_start(record["pid"]) != record["pid_start"]  # its pid, read here
        refused = 0
        deadline = time.monotonic() + 2 * lease_s  # the holder renews every lease_s / 4
        while time.monotonic() < deadline:
            with pytest.raises(jaxjob.CheckpointInUseError, match="in another PID namespace"):
                lock.WriterLock(str(tmp_path), "local", lease_s=lease_s).take()
            refused += 1
            time.sleep(0.1)
        holder.send("die")  # a crash: the lock neither released nor renewed any more
        holder.proc.wait(timeout=30)
        last_renewed = _record(_lock_file(tmp_path))["renewed"]
        taker = lock.WriterLock(str(tmp_path), "local", lease_s=lease_s)
        while True:
            try:
                taker.take()
                break
            except jaxjob.CheckpointInUseError:
                assert time.time() < last_renewed + 10 * lease_s
                time.sleep(0.05)
        assert time.time() - last_renewed >= lease_s and refused >= 3
        assert _record(_lock_file(tmp_path))["pid"] == os.getpid()
        taker.release()
    finally:
        holder.close()


@pytest.mark.parametrize(
    ("store", "deleted", "async_save"),
    [
        ("local", "db_prefix", True),
        ("local", "db_prefix", False),
        ("local", ".jaxjob", False),
        ("s3", "db_prefix", False),
        ("gcs", "db_prefix", False),
    ],
)
def test_a_deleted_db_prefix_fails_the_next_save_naming_the_lock(
    tmp_path, store, deleted, async_save, request
):
    """rm -rf of the db_prefix (or its .jaxjob/) between two saves: the next save raises
    CheckpointInUseError naming the lock at once, and re-creates nothing under the prefix."""
    prefix = (
        str(tmp_path / "run") if store == "local" else request.getfixturevalue(f"{store}_prefix")
    )
    ckpt = jaxjob.CheckpointManager(prefix, async_save=async_save)
    ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
    ckpt.wait_until_finished()
    fs.rmtree(prefix if deleted == "db_prefix" else fs.join(prefix, ".jaxjob"))
    started = time.monotonic()
    with pytest.raises(
        jaxjob.CheckpointInUseError,
        match=re.escape(lock.lock_path(prefix, "local"))
        + ": this process no longer holds .*vanished",
    ):
        ckpt.save(1, jaxjob.Workspace({"w": jnp.zeros(2)}))
    assert time.monotonic() - started < 5  # the save's own check, not the renewal (15 s)
    ckpt.close()
    left = fs.listdir(prefix)
    assert left == ([] if deleted == "db_prefix" else ["local.0"]), left
    if store == "local" and deleted == "db_prefix":
        assert not os.path.exists(prefix)  # not even the directory was made again
    assert not fs.exists(fs.join(prefix, "local.1"))


def test_a_lock_taken_over_meanwhile_fails_the_next_save_naming_the_new_holder(tmp_path):
    """A record replaced by another writer (after this one's lease lapsed): the next save fails
    naming it, writes nothing, and the other writer's record stays."""
    prefix = str(tmp_path)
    ckpt = jaxjob.CheckpointManager(prefix, async_save=False)
    ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(2)}))
    other = _write_record(_lock_file(tmp_path), host="node-7", pid=4242)
    path = lock.lock_path(prefix, "local")
    with pytest.raises(jaxjob.CheckpointInUseError, match=r"taken over by host 'node-7', pid 4242"):
        ckpt.save(1, jaxjob.Workspace({"w": jnp.zeros(2)}))
    ckpt.close()
    assert json.loads(fs.read_text(path))["token"] == other.token  # not released: not ours
    assert not fs.exists(fs.join(prefix, "local.1"))


@pytest.mark.parametrize("store", ["local", "s3", "gcs"])
def test_a_holder_finds_out_at_renewal_that_its_lock_was_taken_and_stops(tmp_path, store, request):
    """A renewal meeting another writer's record marks the lock lost and overwrites nothing."""
    prefix = str(tmp_path) if store == "local" else request.getfixturevalue(f"{store}_prefix")
    held = lock.WriterLock(prefix, "local", lease_s=0.4)
    held.take()
    other = dataclasses.replace(lock.Holder.me(), host="node-7", pid=4242)
    if store == "local":
        _write_record(_lock_file(tmp_path), **dataclasses.asdict(other))
    else:
        fs.write_text(held.path, json.dumps(dataclasses.asdict(other)))
    _wait(lambda: held.lost is not None)
    assert "node-7" in held.lost or "changed by another writer" in held.lost
    held._thread.join(2)
    assert not held._thread.is_alive()
    held.release()
    assert json.loads(fs.read_text(held.path))["token"] == other.token


def _child(ckpt, *extra, env=None):
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(ckpt), os.devnull, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _wait_for_holder(path, pids, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (_record(path) or {}).get("pid") in pids:
            return _record(path)
        time.sleep(0.1)
    raise AssertionError(f"no process of {pids} took the lock {path}")


def test_second_process_fails_then_takes_over_once_the_holder_is_killed(tmp_path):
    """A second run on a live writer's directory fails naming it; after kill -9 it takes over."""
    holder = _child(tmp_path, "--epochs", "1000", "--sleep-per-epoch", "0.2")
    try:
        _wait_for_holder(_lock_file(tmp_path), {holder.pid})
        second = _child(tmp_path, "--epochs", "2")
        out, err = second.communicate(timeout=300)
        assert second.returncode == 3, err[-2000:]
        assert f"host {socket.gethostname()!r}, pid {holder.pid}, started " in out
        assert "Saving epoch" not in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    dying = _child(tmp_path, "--epochs", "2", env={faults.KILL_AT_ENV: "lock.takeover"})
    dying.communicate(timeout=300)
    assert dying.returncode == -signal.SIGKILL  # killed while taking over: nothing changed
    assert _record(_lock_file(tmp_path))["pid"] == holder.pid
    third = _child(tmp_path, "--epochs", "2")
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-2000:]
    assert f"Taking over the lock {tmp_path}/.jaxjob/local.lock of a dead writer" in err
    assert f"pid {holder.pid}" in err
    assert not _lock_file(tmp_path).exists()  # released at exit


def test_every_process_of_a_job_refuses_a_lock_a_live_writer_holds(tmp_path):
    """Under launch -n 2, a live writer's lock elsewhere: both processes fail naming the holder,
    and nothing is written."""
    _write_record(_lock_file(tmp_path), host="node-7", pid=4242, started=0.0)
    job = subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--", sys.executable, SCRIPT]
        + [str(tmp_path), os.devnull, "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode != 0, job.stderr[-3000:]
    refused = sorted(line for line in job.stdout.splitlines() if "] IN_USE " in line)
    assert [line.split("]")[0] for line in refused] == ["[process=0", "[process=1"], job.stdout
    assert all("another writer (host 'node-7', pid 4242" in line for line in refused), refused
    assert "Saving epoch" not in job.stderr
    assert sorted(os.listdir(tmp_path)) == [".jaxjob"]  # nothing written but the lock


@pytest.mark.slow
def test_processes_of_one_job_share_one_lock(tmp_path):
    """Under launch -n 2, process 0 holds the job's lock and alone applies keep=Last(2)."""
    job = subprocess.Popen(
        [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--", sys.executable, SCRIPT]
        + [str(tmp_path), os.devnull, "--epochs", "12", "--sleep-per-epoch", "0.3"]
        + ["--keep", "keep.Last(2)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _record(_lock_file(tmp_path)):
            assert time.monotonic() < deadline and job.poll() is None, job.stderr.read()[-3000:]
            time.sleep(0.1)
        record = _record(_lock_file(tmp_path))
        assert record["processes"] == 2
        other = _child(tmp_path, "--epochs", "2")
        out, err = other.communicate(timeout=300)
        assert other.returncode == 3, err[-2000:]
        assert f"pid {record['pid']} (process 0 of a 2-process job)" in out
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    assert out.count("finished at epoch 12") == 2
    assert not _lock_file(tmp_path).exists()
    assert jaxjob.CheckpointManager(str(tmp_path)).committed_epochs() == [11, 12]  # one deleter


@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_the_lock_on_an_object_store_is_an_object(store, request):
    """On gs:// and s3:// a live holder's lock object refuses, a lapsed one is taken over."""
    prefix = request.getfixturevalue(f"{store}_prefix")
    path = f"{prefix}/.jaxjob/local.lock"
    live = dataclasses.replace(lock.Holder.me(), host="node-7", pid=4242)
    fs.write_text(path, json.dumps(dataclasses.asdict(live)))
    with pytest.raises(
        jaxjob.CheckpointInUseError, match=r"another writer \(host 'node-7', pid 4242"
    ):
        jaxjob.CheckpointManager(prefix).init()
    lapsed = dataclasses.replace(live, renewed=time.time() - lock.LEASE_S - 5)
    fs.write_text(path, json.dumps(dataclasses.asdict(lapsed)))
    ckpt = jaxjob.CheckpointManager(prefix)
    ckpt.init()
    assert json.loads(fs.read_text(path))["pid"] == os.getpid()
    ckpt.close()
    assert not fs.exists(path)
