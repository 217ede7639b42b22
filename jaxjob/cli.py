"""The ``jaxjob`` command line: ``ls``, ``show``, ``export``, ``verify``, ``bench`` and ``launch``.

Parsing and ``--help`` import neither JAX nor Orbax; each subcommand imports
what it needs when it runs (the subcommands' code, or the launcher's). A
user mistake (a missing directory, an unknown epoch, a pattern matching
nothing, a ``gs://`` or ``s3://`` path without its extra installed) is one
line on stderr and exit status 2, never a traceback. Output piped into a
reader that stops early (``jaxjob ls DIR | head``) ends the command quietly,
with status 141 (128 + SIGPIPE).
"""

import sys

from jaxjob._src.cli.main import main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
