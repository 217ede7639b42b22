import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # cross_version.py, a script .ci/run also runs
