"""The lock record: whose pid counts, conditional changes on object stores, races to take it."""

import contextlib
import dataclasses
import inspect
import json
import os
import socket
import time

import pytest
from lock_racer import Racer, namespaces_work, race

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CheckpointInUseError
from jaxjob._src.manager import lock
from jaxjob._src.manager.lock.holder import parse
from jaxjob._src.manager.lock.local_file import LocalRecord
from jaxjob._src.manager.lock.object_store import RemoteRecord
from jaxjob._src.manager.lock.pids import pid_space
from jaxjob._src.manager.lock.record import Lost, Record

DEAD_PID = 2**22 + 17  # above the kernel's largest pid: no process has it
FIELDS_OF_0_1 = ("host", "pid", "pid_start", "started", "renewed", "token", "processes")


def _holder(**changes):
    return dataclasses.replace(lock.Holder.me(), **changes)


def _put(path, holder):
    """Writes the record as another process would (unconditionally)."""
    if fs.is_remote(path):
        fs.write_text(path, json.dumps(dataclasses.asdict(holder)))
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dataclasses.asdict(holder), f)


def _read(path):
    return (RemoteRecord if fs.is_remote(path) else LocalRecord)(path).read()


@pytest.mark.parametrize(
    "path", ["/ckpt/.jaxjob/local.lock", "s3://b/.jaxjob/local.lock", "gs://b/x"]
)
def test_each_backend_keeps_the_one_record_protocol(path):
    """The lock file and the lock object are each a Record: path, read and change alike."""
    record = (RemoteRecord if fs.is_remote(path) else LocalRecord)(path)
    assert isinstance(record, Record) and record.path == path
    for method in ("read", "change"):
        assert inspect.signature(getattr(type(record), method)) == inspect.signature(
            getattr(Record, method)
        )


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
    with pytest.raises(CheckpointInUseError, match=r"in another PID namespace or boot"):
        lock.WriterLock(str(tmp_path), "local").take()
    _put(path, _holder(pid=DEAD_PID, pidns="pid:[1]", renewed=time.time() - lock.LEASE_S - 1))
    held = lock.WriterLock(str(tmp_path), "local")
    held.take()
    assert _read(path).pid == os.getpid()
    held.release()


@pytest.fixture(params=["gcs", "s3"])
def remote_lock(request):
    """The lock path of node ``local`` under a fresh prefix of a real local object store."""
    return lock.lock_path(request.getfixturevalue(f"{request.param}_prefix"), "local")


def test_a_remote_change_loses_to_a_write_between_its_read_and_its_write(remote_lock):
    """A conditional replace (renewal, take-over) raises Lost: the other writer's record stays."""
    record, other = RemoteRecord(remote_lock), _holder(host="node-7")
    record.change(lambda current: _holder(), create=True)

    def renew_after_another_write(current):
        _put(remote_lock, other)  # another writer, between our read and our write
        return dataclasses.replace(current, renewed=time.time())

    with pytest.raises(Lost):
        record.change(renew_after_another_write)
    assert record.read() == other
    with pytest.raises(Lost):  # create-only: the record exists meanwhile
        fs.remove(remote_lock)
        record.change(lambda current: (_put(remote_lock, other), _holder())[1])
    assert record.read() == other


def test_a_remote_write_that_finds_its_own_record_stands(remote_lock):
    """A write whose precondition fails on the very record it writes (a client's retry) wins."""
    record, mine = RemoteRecord(remote_lock), _holder()
    _put(remote_lock, _holder(host="node-7", renewed=0.0))
    assert record.change(lambda current: (_put(remote_lock, mine), mine)[1]) == mine
    assert record.read() == mine


def test_a_remote_release_keeps_a_record_rewritten_meanwhile_s3(s3_prefix):
    """S3's conditional delete: a release after another writer's write removes nothing."""
    path = lock.lock_path(s3_prefix, "local")
    record, other = RemoteRecord(path), _holder(host="node-7")
    record.change(lambda current: _holder(), create=True)
    with pytest.raises(Lost):
        record.change(lambda current: _put(path, other))  # returns None: delete
    assert record.read() == other


def _pool(cloud_servers, ours, foreign):
    """``ours`` racing processes in this PID namespace, ``foreign`` each in one of its own.

    The object stores start first: the racers inherit the environment naming them.
    """
    for start in (cloud_servers.s3, cloud_servers.gcs):
        with contextlib.suppress(pytest.skip.Exception):
            start()
    foreign = foreign if namespaces_work() else 0
    pool = [Racer() for _ in range(ours)] + [Racer(namespace=True) for _ in range(foreign)]
    yield pool
    for racer in pool:
        racer.close()


@pytest.fixture(scope="module")
def racers(cloud_servers):
    """Two racers in this PID namespace, one in another (the default tier's races)."""
    yield from _pool(cloud_servers, 2, 1)


@pytest.fixture(scope="module")
def many_racers(cloud_servers):
    """Four racers in this PID namespace, two in others (the slow tier's races)."""
    yield from _pool(cloud_servers, 4, 2)


def _rounds(rounds, racers, prefix, stale):
    """Races ``rounds`` rounds, each over a new ``stale()`` record; each round's winner."""
    path = lock.lock_path(prefix, "local")
    winners = []
    for _ in range(rounds):
        _put(path, stale())
        answers = race(racers, prefix)
        won = [i for i, a in enumerate(answers) if a.startswith("won ")]
        assert all(a.startswith(("won ", "lost ")) for a in answers), answers
        assert len(won) == 1, answers
        assert _read(path).token == answers[won[0]].split()[1]
        assert [r.ask("release") for r in racers] == ["released"] * len(racers)
        winners.append(racers[won[0]])
    return winners


ROUNDS = [(3, "racers"), pytest.param((40, "many_racers"), marks=pytest.mark.slow)]


@pytest.mark.parametrize("rounds", ROUNDS, ids=["3-rounds", "40-rounds"])
def test_processes_racing_for_a_dead_local_holder_have_one_winner(tmp_path, rounds, request):
    """A dead pid of this namespace, lease fresh: one of this namespace's racers wins each round.

    The racers in other PID namespaces cannot judge that pid: they refuse the fresh lease.
    """
    count, pool = rounds[0], request.getfixturevalue(rounds[1])
    stale = lambda: _holder(pid=DEAD_PID, pid_start=None)  # noqa: E731
    winners = _rounds(count, pool, str(tmp_path), stale)
    assert not any(w.namespace for w in winners)
    print(f"local, dead pid: {count} rounds, {len(pool)} racers, one winner each")


@pytest.mark.parametrize("rounds", ROUNDS, ids=["3-rounds", "40-rounds"])
@pytest.mark.parametrize("store", ["local", "s3", "gcs"])
def test_processes_racing_for_a_lapsed_lease_have_one_winner(tmp_path, rounds, store, request):
    """A lease lapsed long ago, raced by every racer (both namespaces): one winner each round."""
    count, pool = rounds[0], request.getfixturevalue(rounds[1])
    prefix = str(tmp_path) if store == "local" else request.getfixturevalue(f"{store}_prefix")
    stale = lambda: _holder(host="node-7", renewed=time.time() - 10 * lock.LEASE_S)  # noqa: E731
    winners = _rounds(count, pool, prefix, stale)
    foreign = sum(w.namespace for w in winners)
    print(f"{store}, lapsed lease: {count} rounds, {len(pool)} racers, one winner each ", end="")
    print(f"({foreign} of them in another PID namespace)")
