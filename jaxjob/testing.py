"""Fault injection: run a job in a child process, kill it, restart it, check that resume is exact.

A job script that writes its final workspace with :func:`dump_workspace` can
be checked the way jaxjob checks itself: run it once without interruption,
then run it again killed with SIGKILL at a chosen phase of a save (a fail
point of :data:`jaxjob.testing.POINTS`) or after a chosen delay, restart it, and
compare the two final workspaces bit for bit::

    # my_job.py: ... last = jaxjob.JobRunner(job, ckpt).train(session)
    #            jaxjob.testing.dump_workspace(session.workspace, sys.argv[2])
    from jaxjob import testing

    testing.run(["my_job.py", "ref/ckpt", "ref/out"])
    result = testing.kill_and_resume(["my_job.py", "x/ckpt", "x/out"], "x/ckpt",
                                     kill_at="save.write:3")
    testing.assert_bitwise_equal("ref/out", "x/out")

The child runs ``python ARGV...``, or with ``processes=N`` every process of
``python -m jaxjob.cli launch -n N -- python ARGV...``, in a process group
of its own; a run ends only once every process of that group has exited
(what is left is SIGKILLed), so a restart never meets the killed job's
processes holding its lock or its port. The restart is checked
to resume from the newest epoch committed when the job was killed: that
checkpoint directory must come through the restart untouched (a job that
starts again from scratch rewrites it). The checks need ``db_prefix`` on
local disk.

Example:
    >>> import tempfile, jax.numpy as jnp
    >>> out = tempfile.mkdtemp()
    >>> dump_workspace({"w": jnp.arange(3.0)}, out)
    >>> assert_bitwise_equal(out, {"w": jnp.arange(3.0)})
    >>> assert_bitwise_equal(out, {"w": jnp.arange(3.0) + 1e-7})
    Traceback (most recent call last):
    ...
    AssertionError: the workspaces differ at ['w'] (shard 0): ...
"""

from jaxjob._src.testing.testing import POINTS as POINTS
from jaxjob._src.testing.testing import Kill as Kill
from jaxjob._src.testing.testing import assert_bitwise_equal as assert_bitwise_equal
from jaxjob._src.testing.testing import assert_checkpoints_equal as assert_checkpoints_equal
from jaxjob._src.testing.testing import dump_workspace as dump_workspace
from jaxjob._src.testing.testing import kill_and_resume as kill_and_resume
from jaxjob._src.testing.testing import run as run
from jaxjob._src.testing.testing import run_killed as run_killed

__all__ = [
    "Kill",
    "POINTS",
    "assert_bitwise_equal",
    "assert_checkpoints_equal",
    "dump_workspace",
    "kill_and_resume",
    "run",
    "run_killed",
]
