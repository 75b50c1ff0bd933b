"""Shared pytest setup: make the in-tree package importable when it was built
in place (``python setup.py build_ext --inplace``) rather than pip-installed,
and the test helpers (launch.py, refs.py, ...) importable by name (also in the
spawned rank processes, which inherit sys.path)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (HERE, REPO):
    if p not in sys.path:
        sys.path.insert(0, p)
