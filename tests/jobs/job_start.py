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

:func:`imported` also lets every process of a multi-process job write the test run's JAX
compilation cache (see :func:`_cache_every_process`).
"""

import gc
import os
import sys
import warnings

_IN_JOB = os.path.dirname(
    os.path.abspath(getattr(sys.modules["__main__"], "__file__", "") or "")
) == (os.path.dirname(os.path.abspath(__file__)))
if _IN_JOB:
    gc.disable()


def _cache_every_process() -> None:
    """Lets processes other than 0 of a multi-process job write JAX's compilation cache too.

    On the CPU, JAX 0.10 keys what process i > 0 of a multi-process job compiles by that
    process, and only process 0 writes the persistent cache (to spare shared file systems
    concurrent writers): the other processes of every 2-process child job compiled all
    their programs again, ~1.5 s of CPU a run, the biggest single cost of the multi-process
    tests. Here those processes write their own entries (other keys than process 0's; the
    same executable a compile gives, so no result changes), through the cache's own write
    function; only the test jobs do this, when the tests set ``JAX_COMPILATION_CACHE_DIR``.
    JAX's private module is used with care: if its names change, nothing is patched.
    """
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    try:
        from jax._src import compilation_cache, compiler, config, distributed
    except ImportError:
        return
    original = getattr(compiler, "_cache_write", None)
    put = getattr(compilation_cache, "put_executable_and_time", None)
    if original is None or put is None or getattr(original, "every_process", False):
        return

    def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        if distributed.global_state.process_id == 0 or host_callbacks:
            return original(
                cache_key, compile_time_secs, module_name, backend, executable, host_callbacks
            )
        if compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
            return None
        try:
            return put(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as err:  # as JAX's own write: a cache that cannot be written warns
            warnings.warn(
                f"compilation cache entry for {module_name!r} not written: {err!r}", stacklevel=2
            )
            return None

    write.every_process = True
    compiler._cache_write = write


def count_lowerings():
    """Counts, from now on, how many times JAX lowers each program (to compile it or to look it
    up in the compilation cache); returns a function giving the counts of the job's programs
    whose names hold ``init`` or ``train`` (jaxjob names a program after its tasks)."""
    import collections

    import jax

    lowered: collections.Counter = collections.Counter()

    def listen(event, duration, fun_name=None, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered[fun_name] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    return lambda: {k: n for k, n in lowered.items() if "init" in k or "train" in k}


def imported() -> None:
    """The script's imports are done: freeze what they made and turn the collector on again."""
    if _IN_JOB:
        _cache_every_process()
    if _IN_JOB and not gc.isenabled():
        gc.freeze()
        gc.enable()
