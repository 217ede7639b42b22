"""The runner's Manager protocol lists what run/ calls; a null manager stands in for none."""

import ast
import os
import signal

import jax.numpy as jnp
import pytest

import jaxjob
from jaxjob._src.run import protocol

RUN = os.path.join(os.path.dirname(jaxjob.__file__), "_src", "run")
PROTOCOLS = [
    getattr(protocol, name)
    for name in ("Manager", "Tier", "LocalTier", "Reader")
    if hasattr(protocol, name)
]


def _members(cls):
    """The names a Protocol class declares (methods, properties, annotated attributes)."""
    names = set()
    for klass in cls.__mro__:
        if klass in (object,) or not getattr(klass, "_is_protocol", False):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
        names |= {n for n in getattr(klass, "__annotations__", {}) if not n.startswith("_")}
    return names - {"Protocol"}


def _attributes_used_in_run():
    """Every ``.name`` read in run/ outside the protocol module."""
    used = set()
    for name in sorted(os.listdir(RUN)):
        if name.endswith(".py") and name != "protocol.py":
            with open(os.path.join(RUN, name)) as f:
                tree = ast.parse(f.read())
            used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return used


@pytest.mark.parametrize("cls", PROTOCOLS, ids=lambda c: c.__name__)
def test_every_protocol_member_is_used_by_run(cls):
    """The protocol lists nothing that run/ does not call (its members are all used)."""
    unused = _members(cls) - _attributes_used_in_run()
    assert not unused, f"{cls.__name__} lists members run/ never uses: {sorted(unused)}"


def test_the_null_manager_has_every_member_of_the_protocol():
    """NullManager provides each Manager member: the runner never needs an ``is None`` branch."""
    missing = {n for n in _members(protocol.Manager) if not _has(protocol.NullManager(), n)}
    assert not missing


@pytest.mark.parametrize("kind", ["CheckpointManager", "MultiNodeCheckpointManager"])
def test_both_managers_have_every_member_of_the_protocol(tmp_path, kind):
    """Either checkpoint manager provides each Manager member."""
    manager = getattr(jaxjob, kind)(str(tmp_path))
    try:
        missing = {n for n in _members(protocol.Manager) if not _has(manager, n)}
    finally:
        manager.close()
    assert not missing


def _has(obj, name):
    """Whether ``obj`` has ``name`` (a property is not called: some need ``init`` first)."""
    return hasattr(type(obj), name) or name in vars(obj)


class _Recording:
    """A real object whose attribute reads are recorded by kind (manager, tier, reader)."""

    def __init__(self, target, kind, seen):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name):
        self._seen.setdefault(self._kind, set()).add(name)
        value = getattr(self._target, name)
        if self._kind == "Manager" and name == "tier":
            return lambda *a, **k: self._wrap(value(*a, **k), "Tier")
        if self._kind == "Tier" and name == "reader":
            return self._wrap(value, "Reader")
        return value

    def _wrap(self, value, kind):
        return None if value is None else _Recording(value, kind, self._seen)


def _counting_job(epochs):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    jaxjob.epoch_limiter(job, epochs)
    return job


def test_the_runner_calls_only_protocol_members_in_a_two_tier_run_and_its_resume(tmp_path, caplog):
    """Through a real two-tier manager, a run that dies in epoch 4 and its resume from local
    epoch 3 (persistent: 0 and 2) read only names the protocol lists (manager, tier, reader)."""
    seen, dying = {}, [True]

    def die(ws):
        if dying[0] and float(ws["x"]) == 4:
            raise RuntimeError("killed")

    for _ in range(2):
        ckpt = jaxjob.CheckpointManager(
            str(tmp_path / "ckpt"), local=jaxjob.LocalTier(str(tmp_path / "local"))
        )
        job = _counting_job(5)
        job.epoch_group.add(die, jit=False)
        runner = jaxjob.JobRunner(job, _Recording(ckpt, "Manager", seen), save_every_epochs=2)
        try:
            if dying[0]:
                with pytest.raises(RuntimeError, match="killed"):
                    runner.train(jaxjob.Session())
            else:
                assert runner.train(jaxjob.Session()) == 5
        finally:
            ckpt.close()
        dying[0] = False
    assert "Resuming from epoch 3 of the local tier" in caplog.text
    assert ckpt.committed_epochs() == [0, 2, 4, 5]
    assert {"candidates", "forget", "reader"} <= seen["Tier"]  # the local restore ran
    declared = {c.__name__: _members(c) for c in PROTOCOLS}
    declared["Tier"] = declared["Tier"] | declared.get("LocalTier", set())
    for kind, names in seen.items():
        assert names <= declared[kind], f"{kind}: not in the protocol: {names - declared[kind]}"


def test_without_a_manager_what_needs_one_says_so():
    """A runner without a checkpoint manager: resuming, saving and loading name what is missing."""
    job = _counting_job(2)
    with pytest.raises(ValueError, match="resume_from_epoch needs a checkpoint_manager"):
        jaxjob.JobRunner(job, resume_from_epoch=1).train(jaxjob.Session())
    runner = jaxjob.JobRunner(job)
    session = jaxjob.Session()
    assert runner.train(session) == 2 and float(session.workspace["x"]) == 2.0
    with pytest.raises(ValueError, match="save_checkpoints needs a checkpoint_manager"):
        runner.save_checkpoints(3, session)
    with pytest.raises(ValueError, match="load_blobs_from_checkpoints needs a checkpoint_manager"):
        runner.load_blobs_from_checkpoints(["x"], 2, session)
    assert runner.save_errors == []
    assert [sorted(r) for r in runner.history] == [["epoch", "epoch_time_s", "save_time_s"]] * 2
    assert {r["save_time_s"] for r in runner.history} == {0.0}  # nothing was saved


def test_without_a_manager_preemption_signals_are_left_alone():
    """No manager: SIGTERM keeps its handler during train (a preemption would have nothing
    to save)."""
    handlers = []
    job = _counting_job(1)
    job.epoch_group.add(lambda ws: handlers.append(signal.getsignal(signal.SIGTERM)), jit=False)
    before = signal.getsignal(signal.SIGTERM)
    jaxjob.JobRunner(job).train(jaxjob.Session())
    assert handlers == [before]
