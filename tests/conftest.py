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

# FAIRRING_TEST_DUMP_AFTER=<s> (the GPU check sets it just under its time
# limit): the pytest process dumps every thread's Python stack after that
# long, so a hang shows where it was before the limit kills it.
if os.environ.get("FAIRRING_TEST_DUMP_AFTER"):
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ["FAIRRING_TEST_DUMP_AFTER"]), exit=False)
