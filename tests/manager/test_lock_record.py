"""The lock record: whose pid counts, and how records of other versions read."""

import dataclasses
import json
import os
import pathlib
import socket
import time

import pytest

from jaxjob._src.manager import lock
from jaxjob._src.manager.lock_record import parse, pid_space

DEAD_PID = 2**22 + 17  # above the kernel's largest pid: no process has it
FIELDS_OF_0_1 = ("host", "pid", "pid_start", "started", "renewed", "token", "processes")


def _holder(**changes):
    return dataclasses.replace(lock.Holder.me(), **changes)


def _put(path, holder):
    """Writes the record as another process would."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dataclasses.asdict(holder), f)


def test_this_process_records_its_boot_and_pid_namespace():
    """Holder.me() names this boot and PID namespace; its own pid is comparable here."""
    me = lock.Holder.me()
    assert (me.boot_id, me.pidns) == pid_space()
    assert me.pidns == os.readlink("/proc/self/ns/pid") and me.pid_comparable()
    assert me.alive(lock.LEASE_S, {me.token}) and not me.alive(lock.LEASE_S, set())


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"pidns": "pid:[1]"},  # a container on this host: another PID namespace
        {"boot_id": "another-boot"},  # this host before a reboot
        {"boot_id": None, "pidns": None},  # written by a jaxjob without these fields
    ],
)
def test_a_pid_of_another_namespace_or_boot_is_judged_by_the_lease_alone(elsewhere):
    """Same host name, a pid dead here: alive while the lease is fresh, dead once it lapsed."""
    fresh = _holder(pid=DEAD_PID, pid_start="1", **elsewhere)
    assert not fresh.pid_comparable()
    assert fresh.alive(lock.LEASE_S, set())  # its pid means nothing here
    assert "in another PID namespace or boot" in fresh.describe()
    lapsed = dataclasses.replace(fresh, renewed=time.time() - lock.LEASE_S - 1)
    assert not lapsed.alive(lock.LEASE_S, set())
    assert fresh.host == socket.gethostname()


def test_records_of_older_and_newer_versions_parse():
    """A record lacking boot_id/pidns parses (foreign namespace); unknown fields are ignored."""
    doc = dataclasses.asdict(_holder(pid=DEAD_PID))
    old = parse(json.dumps({k: doc[k] for k in FIELDS_OF_0_1}))
    assert old is not None and old.pidns is None and old.alive(lock.LEASE_S, set())
    newer = parse(json.dumps({**doc, "lease_s": 60, "cgroup": "/x"}))
    assert newer == lock.Holder(**doc)
    assert parse("") is None and parse("{not json") is None and parse("[1]") is None


def test_a_fresh_foreign_namespace_record_is_not_taken_a_lapsed_one_is(tmp_path):
    """WriterLock refuses a same-host record of another PID namespace until its lease lapses."""
    path = lock.lock_path(str(tmp_path), "local")
    _put(path, _holder(pid=DEAD_PID, pidns="pid:[1]"))
    with pytest.raises(lock.CheckpointInUseError, match=r"in another PID namespace or boot"):
        lock.WriterLock(str(tmp_path), "local").take()
    _put(path, _holder(pid=DEAD_PID, pidns="pid:[1]", renewed=time.time() - lock.LEASE_S - 1))
    held = lock.WriterLock(str(tmp_path), "local")
    held.take()
    assert parse(pathlib.Path(path).read_text()).pid == os.getpid()
    held.release()
