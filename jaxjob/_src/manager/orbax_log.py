"""Orbax's tracebacks of a failing jaxjob save: moved from absl's log to jaxjob's DEBUG."""

from __future__ import annotations

import logging
import os

from jaxjob._src.base.log import get_logger

__all__ = ["saving"]

logger = get_logger(__name__)


class _OrbaxSaveErrors(logging.Filter):
    """Moves Orbax's tracebacks of a failing jaxjob save from absl's log to jaxjob's DEBUG.

    While a save of this process is in flight, Orbax's background threads log
    each failure at ERROR with its traceback (several records, hundreds of
    lines); jaxjob reports the failure itself, in one line, when it surfaces.
    Other Orbax records, and all of them while no save is in flight, pass.
    """

    def __init__(self) -> None:
        super().__init__()
        self.saving: set[str] = set()  # the directories of this process's saves in flight

    def filter(self, record: logging.LogRecord) -> bool:
        """False (re-logged at DEBUG) for an Orbax traceback during a save."""
        if (
            not self.saving
            or record.levelno < logging.WARNING
            or not record.exc_info
            or not _from_orbax(record)
        ):
            return True
        logger.debug("Orbax: %s", record.getMessage(), exc_info=record.exc_info)
        return False


_ORBAX_SOURCE = f"{os.sep}orbax{os.sep}checkpoint{os.sep}"


def _from_orbax(record: logging.LogRecord) -> bool:
    """Whether Orbax logged ``record`` or its traceback passes through Orbax.

    The record's own ``pathname`` names Orbax only when absl's logger class
    is installed before Orbax's logger is made (it depends on import order),
    so the traceback is read too.
    """
    if _ORBAX_SOURCE in record.pathname:
        return True
    traceback = record.exc_info[2] if record.exc_info else None
    while traceback is not None:
        if _ORBAX_SOURCE in traceback.tb_frame.f_code.co_filename:
            return True
        traceback = traceback.tb_next
    return False


_orbax_errors = _OrbaxSaveErrors()
logging.getLogger("absl").addFilter(_orbax_errors)

saving = _orbax_errors.saving
