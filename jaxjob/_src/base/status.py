"""What a run says it did: one plain line each, shown whether or not logging is configured.

Resuming (from which epoch, and which tier), a job already finished, an
epoch limit below the epochs already done, retention keeping every epoch
past a size worth mentioning: the ``jaxjob.status`` logger says each at
INFO. A program that configured no logging shows no INFO line (Python's
default shows WARNING and above), so that logger has a handler of its own
that writes a line to stderr when no handler of the program would show it:
with logging configured, each line is shown once, by the program's handlers;
without, it is still shown. ``logging.getLogger("jaxjob.status").setLevel(
logging.WARNING)`` silences them.

Example:
    >>> import logging
    >>> status_logger().logger.name, logging.getLogger(STATUS).level == logging.INFO
    ('jaxjob.status', True)
"""

from __future__ import annotations

import logging
import sys

from jaxjob._src.base.log import get_logger

__all__ = ["STATUS", "status_logger"]

STATUS = "jaxjob.status"


class _WhenUnshown(logging.StreamHandler):
    """Writes a record to stderr only if no handler it propagates to would show it."""

    def emit(self, record: logging.LogRecord) -> None:
        """Writes ``record``, unless another handler shows it."""
        if not _shown_elsewhere(record):
            self.setStream(sys.stderr)  # the stream of now (a notebook or a test replaces it)
            super().emit(record)


def _shown_elsewhere(record: logging.LogRecord) -> bool:
    logger: logging.Logger | None = logging.getLogger(STATUS)
    while logger is not None:
        handlers = [h for h in logger.handlers if not isinstance(h, _WhenUnshown)]
        if any(record.levelno >= h.level for h in handlers):
            return True
        logger = logger.parent if logger.propagate else None
    return False


def _install() -> None:
    logger = logging.getLogger(STATUS)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not any(isinstance(h, _WhenUnshown) for h in logger.handlers):
        handler = _WhenUnshown(sys.stderr)
        handler.setFormatter(logging.Formatter("jaxjob: %(message)s"))
        logger.addHandler(handler)


def status_logger() -> logging.LoggerAdapter:
    """The ``jaxjob.status`` logger (each line names its process in a multi-process job)."""
    return get_logger(STATUS)


_install()
