"""jaxjob's loggers: in a multi-process job every line names its process, ``[process=i]``.

jaxjob logs little at INFO (resuming, the end of training); per-epoch lines
are at DEBUG. Orbax logs dozens of INFO lines per save through absl's
``"absl"`` Python logger: importing jaxjob sets that logger to WARNING unless
it already has a level, or the environment sets ``JAXJOB_ORBAX_LOGS=1``. To
see Orbax's INFO lines: ``logging.getLogger("absl").setLevel(logging.INFO)``.

Loggers carry public names, one hierarchy under ``"jaxjob"``: ``jaxjob.runner``
(training, resume, preemption), ``jaxjob.manager`` (saves, retention; the lock
under ``jaxjob.manager.lock``), ``jaxjob.checkpoint``, ``jaxjob.restore``,
``jaxjob.hosts``, ``jaxjob.distributed``, ``jaxjob.writers``, ``jaxjob.orbax``,
``jaxjob.session``. ``logging.getLogger("jaxjob").setLevel(...)`` sets them all.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import MutableMapping
from typing import Any

from jaxjob._src.base import jax_private

__all__ = ["get_logger", "public_logger_name", "warn"]

# jaxjob/, three levels up from jaxjob/_src/base/log.py: warn() skips every frame under it
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORBAX_LOGS_ENV = "JAXJOB_ORBAX_LOGS"
_PRIVATE = "jaxjob._src."
# The public logger of each implementation layer (jaxjob._src.<layer>) ...
_LAYER_LOGGERS = {
    "base": "jaxjob",
    "checkpoint": "jaxjob.checkpoint",
    "cli": "jaxjob.cli",
    "core": "jaxjob.session",
    "internals": "jaxjob.orbax",
    "manager": "jaxjob.manager",
    "multihost": "jaxjob.hosts",
    "run": "jaxjob.runner",
    "testing": "jaxjob.testing",
}
# ... and of the modules (or packages: all their modules) that serve another public name
_MODULE_LOGGERS = {
    "base.preemption": "jaxjob.runner",
    "checkpoint.restore": "jaxjob.restore",
    "manager.lock": "jaxjob.manager.lock",
    "manager.orbax_log": "jaxjob.orbax",
    "multihost.distributed": "jaxjob.distributed",
    "run.tensorboard": "jaxjob.writers",
    "run.writers": "jaxjob.writers",
}


def quiet_orbax() -> None:
    """Sets absl's logger (Orbax's INFO chatter) to WARNING, unless the user chose a level."""
    absl = logging.getLogger("absl")
    if absl.level == logging.NOTSET and os.environ.get(ORBAX_LOGS_ENV, "") in ("", "0"):
        absl.setLevel(logging.WARNING)


class _ProcessAdapter(logging.LoggerAdapter):
    """Prefixes each message with ``[process=i]`` once ``jax.distributed`` is initialized."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        """Adds the prefix in a ``jax.distributed`` job."""
        process = jax_private.distributed_process_id()
        if process is None:
            return msg, kwargs
        return f"[process={process}] {msg}", kwargs


def public_logger_name(module: str) -> str:
    """The public name of the logger of ``module``: an implementation module's is under ``jaxjob``.

    Example:
        >>> public_logger_name("jaxjob._src.run.resume"), public_logger_name("jaxjob.example")
        ('jaxjob.runner', 'jaxjob.example')
        >>> public_logger_name("jaxjob._src.manager.lock.writer_lock")  # a package's module
        'jaxjob.manager.lock'
    """
    if not module.startswith(_PRIVATE):
        return module
    parts = module[len(_PRIVATE) :].split(".")
    for end in range(len(parts), 1, -1):  # the module, then each package holding it
        if (name := _MODULE_LOGGERS.get(".".join(parts[:end]))) is not None:
            return name
    return _LAYER_LOGGERS.get(parts[0], "jaxjob")


def get_logger(name: str) -> logging.LoggerAdapter:
    """The logger of module ``name``, under its public name (:func:`public_logger_name`).

    Example:
        >>> get_logger("jaxjob.example").logger.name
        'jaxjob.example'
    """
    return _ProcessAdapter(logging.getLogger(public_logger_name(name)), {})


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Issues a warning attributed to the first caller outside jaxjob (the user's line).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn("careful")
        >>> str(caught[0].message), caught[0].category.__name__
        ('careful', 'UserWarning')
    """
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE_DIR + os.sep
    ):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level + 1)


quiet_orbax()
