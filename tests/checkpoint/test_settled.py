"""A failed save surfaces only once every write of it is done, those behind a failed chain too.

Orbax's PyTree handler returns its writes as one ``ChainedFuture`` (the sharding file's write
first, the arrays' after it), which stops at the first failure: a full disk failed the sharding
file while the arrays' write went on and made the removed temporary directory again.
"""

import concurrent.futures
import os
import threading

import pytest
from orbax.checkpoint._src.futures import future as orbax_future

from jaxjob._src.checkpoint.settled import Settled
from jaxjob._src.internals import orbax_handlers


def _fail():
    raise OSError(28, "No space left on device")


def _chain(pool, release):
    """A real Orbax chain: a write that fails at once, then one that waits for ``release``."""
    failing = pool.submit(_fail)
    late = pool.submit(release.wait, 30)
    return orbax_future.ChainedFuture([failing, late], cb=lambda: None), late


def test_members_opens_nested_chains_in_order():
    a, b, c = orbax_future.NoopFuture(), orbax_future.NoopFuture(), orbax_future.NoopFuture()
    inner = orbax_future.ChainedFuture([b, c], cb=lambda: None)
    outer = orbax_future.ChainedFuture([a, inner], cb=lambda: None)
    assert orbax_handlers.members([outer, a]) == [a, b, c, a]
    assert orbax_handlers.members([]) == []


def test_a_chain_alone_surfaces_its_failure_while_a_later_write_still_runs():
    """The gap itself (the control): Orbax's chain raises with its second write in flight."""
    release = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        chained, late = _chain(pool, release)
        with pytest.raises(OSError, match="No space left"):
            Settled([chained]).result()
        assert not late.done()
        release.set()


def test_settled_waits_for_every_member_of_a_failed_chain_before_raising():
    release = threading.Event()
    seen = []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        chained, late = _chain(pool, release)
        threading.Timer(0.3, release.set).start()
        writes = Settled(
            [chained], members=orbax_handlers.members([chained]), on_failure=seen.append
        )
        with pytest.raises(OSError, match="No space left") as raised:
            writes.result()
        assert late.done() and late.result() is True
    assert seen == [raised.value]  # heard once, after every write


def test_a_successful_chain_is_not_waited_twice(tmp_path):
    """Without a failure the chain's own wait is the only one (its callback runs once)."""
    calls = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(os.makedirs, tmp_path / "a")
        chained = orbax_future.ChainedFuture([first], cb=lambda: calls.append(1))
        Settled([chained], members=orbax_handlers.members([chained])).result()
    assert calls == [1] and (tmp_path / "a").is_dir()
