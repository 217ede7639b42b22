"""Where the tests find the repository (its README, examples, notebooks) and the job scripts."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
JOBS = os.path.join(TESTS, "jobs")  # the child-process job scripts
