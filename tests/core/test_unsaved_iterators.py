"""The plain-iterator warning: every spelling of reading an iterator jaxjob cannot checkpoint."""

import itertools
import types
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob
from jaxjob._src.core import data

BATCHES = (np.full(2, i) for i in range(10**6))  # a module-level generator: not checkpointed
ROWS = iter(list(range(10**6)))


class Loader:
    """A loader with get_state/set_state: checkpointable, never warned about."""

    def __init__(self):
        self.n = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        return self.n

    def get_state(self):
        return {"n": self.n}

    def set_state(self, state):
        self.n = state["n"]


SAVED = Loader()
COUNTER = itertools.count()


def read_one():
    return next(BATCHES)


def read_two():
    return [read_one(), read_one()]


def read_saved():
    return next(SAVED)


def in_comprehension(ws):
    return {"batch": [next(BATCHES) for _ in range(2)]}


def in_generator_expression(ws):
    return {"batch": list(next(ROWS) for _ in range(2))}


def in_lambda(ws):
    take = lambda: next(BATCHES)  # noqa: E731 (the spelling under test)
    return {"batch": take()}


def in_nested_function(ws):
    def take():
        return next(BATCHES)

    return {"batch": take()}


def through_a_helper(ws):
    return {"batch": read_one()}


def through_two_helpers(ws):
    return {"batch": read_two()}


def in_a_closure_comprehension():
    batches = iter(range(100))

    def load(ws):
        return {"batch": [next(batches) for _ in range(2)]}

    return load


LOADERS = types.ModuleType("loaders")  # a stand-in for `import loaders`
LOADERS.BATCHES = BATCHES


def through_a_module(ws):
    return {"batch": next(LOADERS.BATCHES)}


class Reader:
    """A task as a method or a callable object, reading ``self.batches``."""

    def __init__(self):
        self.batches = iter(range(100))

    def __call__(self, ws):
        return {"batch": next(self.batches)}

    def load(self, ws):
        return {"batch": [next(self.batches) for _ in range(2)]}


def warned_about(fn):
    """The plain-iterator warnings about an epoch task running ``fn``."""
    task = jaxjob.Task(fn, jit=False, name="load")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.warn_unsaved_iterators([task], set())
    return [str(w.message) for w in caught if "Python iterator" in str(w.message)]


@pytest.mark.parametrize(
    "fn, name",
    [
        (in_comprehension, "BATCHES"),
        (in_generator_expression, "ROWS"),
        (in_lambda, "BATCHES"),
        (in_nested_function, "BATCHES"),
        (through_a_helper, "BATCHES"),
        (through_two_helpers, "BATCHES"),
        (in_a_closure_comprehension(), "batches"),
        (through_a_module, "BATCHES"),
        (lambda ws: {"step": next(COUNTER)}, "COUNTER"),
        (Reader().load, "Reader.batches"),
        (Reader(), "Reader.batches"),
    ],
    ids=lambda x: getattr(x, "__name__", type(x).__name__) if callable(x) else x,
)
def test_every_spelling_of_reading_a_plain_iterator_is_warned_about(fn, name):
    """Comprehensions, generator expressions, lambdas, nested functions, helpers (two deep), a
    closure and a module's attribute: each warning names the task and the iterator."""
    messages = warned_about(fn)
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"epoch task 'load' reads the Python iterator {name!r}")


@pytest.mark.parametrize(
    "fn",
    [
        lambda ws: {"batch": next(SAVED)},
        lambda ws: {"batch": [read_saved() for _ in range(2)]},
        lambda ws: {"x": jnp.sum(jnp.ones(3)) + np.random.default_rng(0).random()},
        lambda ws: {"x": list(itertools.islice(range(5), 2))},
    ],
    ids=["checkpointed-loader", "checkpointed-loader-in-helper", "library-calls", "local-iter"],
)
def test_a_checkpointed_loader_or_library_code_is_not_warned_about(fn):
    """A loader with get_state/set_state, library functions (whose module-level counters are
    not the task's data) and an iterator the task makes itself: no warning."""
    assert warned_about(fn) == []


def test_a_job_fed_by_a_stateful_source_is_not_warned_about(tmp_path):
    """A jaxjob.data.Stateful fed by add_data: its position is saved, no warning."""
    job = jaxjob.Job()
    job.add_data("batch", data.Stateful(Loader(), max_state_bytes=64))
    job.epoch_group.add(lambda ws: {"seen": ws["batch"]}, jit=False, name="see")
    jaxjob.epoch_limiter(job, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(jaxjob.Session())
    assert not [w for w in caught if "Python iterator" in str(w.message)]
