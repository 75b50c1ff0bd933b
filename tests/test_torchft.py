"""torchft's own generic process-group tests (torchft/process_group_test.py,
MultiPgBaseTest: every collective it runs, 3 ranks as threads of one process,
plain and "with resiliency": the last rank shuts its group down, the others'
next collective must fail with one of the phrases torchft expects, then the
group is re-formed) with fairring_py.torchft.ProcessGroupFairring, built the
way those tests build their gloo group.  CI installs torchft; elsewhere the
tests skip without it."""
from __future__ import annotations

import os
from datetime import timedelta

import pytest

if os.environ.get("CI") == "true":
    import torchft.process_group_test as pgt  # CI must have it: a missing install fails here
else:
    pgt = pytest.importorskip("torchft.process_group_test")

from fairring_py.torchft import ProcessGroupFairring  # noqa: E402

# Every collective of torchft's list (gloo skips three; Fairring runs them).
COLLECTIVES = sorted(pgt._ALL_COLLECTIVES)


class _FairringMultiPg(pgt.MultiPgBaseTest):
    BACKEND = "fairring"
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend):
        return ProcessGroupFairring(timeout=timedelta(seconds=1))

    def runTest(self):  # a TestCase needs one to be made outside unittest's runner
        pass


@pytest.fixture(scope="module")
def multi_pg():
    _FairringMultiPg.setUpClass()
    try:
        yield _FairringMultiPg()
    finally:
        _FairringMultiPg.tearDownClass()


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_collective(multi_pg, collective):
    multi_pg._run_parallel(collective, device="cpu")


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_collective_with_resiliency(multi_pg, collective):
    multi_pg._run_with_resiliency(collective, device="cpu")
