"""jaxjob's loggers: in a multi-process job every line names its process, ``[process=i]``."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from jaxjob import orbax_adapter

__all__ = ["get_logger"]


class _ProcessAdapter(logging.LoggerAdapter):
    """Prefixes each message with ``[process=i]`` once ``jax.distributed`` is initialized."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        """Adds the prefix in a ``jax.distributed`` job."""
        process = orbax_adapter.distributed_process_id()
        if process is None:
            return msg, kwargs
        return f"[process={process}] {msg}", kwargs


def get_logger(name: str) -> logging.LoggerAdapter:
    """The logger of module ``name``.

    Example:
        >>> get_logger("jaxjob.example").logger.name
        'jaxjob.example'
    """
    return _ProcessAdapter(logging.getLogger(name), {})
