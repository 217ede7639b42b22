"""Imported first by the job scripts that the tests run as child processes (``python tests/X.py``).

A child spends ~0.15 s of CPU in ~300 garbage collections while it imports JAX, Orbax and jaxjob
(each collection walks the growing heap of modules), and its exit walks that heap once more; the
suite starts hundreds of such children on two cores. So the collector is off from this import
until :func:`imported`, which moves what the imports made to the permanent generation
(:func:`gc.freeze`: later collections, the one at exit included, skip it) and turns the collector
on again: the job itself runs with it on, as a user's job does. Nothing is collected that would
have been freed otherwise (the modules live until exit either way).

It acts only in the script's own process: a test that imports a job script (``exact_job``,
``long_job``) in the pytest process leaves that process's collector alone.
"""

import gc
import os
import sys

_IN_JOB = os.path.dirname(
    os.path.abspath(getattr(sys.modules["__main__"], "__file__", "") or "")
) == (os.path.dirname(os.path.abspath(__file__)))
if _IN_JOB:
    gc.disable()


def imported() -> None:
    """The script's imports are done: freeze what they made and turn the collector on again."""
    if _IN_JOB and not gc.isenabled():
        gc.freeze()
        gc.enable()
