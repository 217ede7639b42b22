"""The ``jaxjob`` command: argument parsing (``main``) and its subcommands (``commands``).

May import any layer, but only when a subcommand runs, so that
``jaxjob --help`` and ``jaxjob launch`` start without JAX or Orbax.
"""
