#!/usr/bin/env python3
"""Run a chosen subset of PyTorch's own DistributedTest cases
(torch.testing._internal.distributed.distributed_test) against a backend,
multi-process, the way torch's test/distributed/test_distributed_spawn.py does
(but its ranks are forked, not spawned: see setUp).

Usage (one process group at a time; every test starts WORLD_SIZE ranks; needs
torch's test dependency `expecttest`):

    python3 tests/scripts/torch_cases.py --backend fairring --world-size 3
    python3 tests/scripts/torch_cases.py --backend gloo     --world-size 3

tests/test_torch_cases.py runs the point-to-point and all-to-all ones.

Options:
    --no-unskip         run torch's decorators as they are (no backend-gate bypass)
    --no-small-ws       keep skip_if_small_worldsize (the *_group variants) as torch has it
    -k SUBSTR           only tests whose name contains SUBSTR (repeatable)
    --only NAME         only the test NAME (repeatable)
    --json FILE         write per-test results as JSON

How it is set up (mirrors test_distributed_spawn.py + the torch_ucc plugin test):
  * env BACKEND, WORLD_SIZE set before distributed_test is imported (its skip
    decorators read the module-level BACKEND when the class body executes);
    TEMP_DIR/barrier is created per test by TestDistBackend.setUp
    (initialize_temp_directories); init is file:// (TestDistBackend.init_method).
  * DistTestCases.backend_feature["plugin"] gets the backend added -- the hook
    torch has for out-of-tree backends (used by require_backend_is_available);
    done before importing distributed_test, as torch_ucc's test does.
  * Some tests are gated on a hard-coded backend name (BACKEND != "mpi" for the
    CPU all_to_all tests, BACKEND != "gloo" for batch_isend_irecv_gloo*,
    require_backend_is_available({"gloo"}) for scatter_object_list).  No feature
    set can enable those.  With unskip on (default) the test class gets, for
    exactly those names, a plain method calling torch's original test body; the
    skip reason is checked first to be the expected backend-name gate (so no
    other, legitimate skip is hidden).  skip_if_small_worldsize (WORLD_SIZE<8
    => skip, for *_group tests; needs >= 3 ranks for group [1, 2]) is bypassed
    the same way by calling the function it wraps, unless --no-small-ws.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FAIRRING_ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout (fairring_py)
if FAIRRING_ROOT not in sys.path:
    sys.path.insert(0, FAIRRING_ROOT)

if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="fairring")
    ap.add_argument("--world-size", type=int, default=3)
    ap.add_argument("--no-unskip", action="store_true")
    ap.add_argument("--no-small-ws", action="store_true")
    ap.add_argument("-k", action="append", default=[])
    ap.add_argument("--only", action="append", default=[], help="exactly this test (repeatable)")
    ap.add_argument("--json")
    ap.add_argument("--per-test-timeout", type=int, default=90)
    ARGS = ap.parse_args()
    # Everything a spawned rank needs goes through the environment: spawned
    # children re-run this file as __mp_main__ and inherit os.environ.
    os.environ["BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    os.environ["DTEST_UNSKIP"] = "0" if ARGS.no_unskip else "1"
    os.environ["DTEST_SMALL_WS"] = "0" if ARGS.no_small_ws else "1"
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.per_test_timeout)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [FAIRRING_ROOT] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x])
    os.environ.setdefault("TEMP_DIR", "/tmp")  # replaced per test by setUp

BACKEND = os.environ["BACKEND"]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if BACKEND == "fairring":
    import fairring_py  # noqa: F401,E402  registers backend "fairring"

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# torch's hook for out-of-tree backends; must happen before distributed_test
# is imported (decorators are evaluated when its class body executes).
if BACKEND not in ("gloo", "nccl", "mpi", "ucc"):
    DistTestCases.backend_feature["plugin"].add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

BASE = DistributedTest._DistTestBase

# The chosen CPU cases.
CASES = [
    # point to point
    "test_send_recv",
    "test_send_recv_autograd_profiler",
    "test_send_recv_any_source",
    "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_with_tag",
    "test_send_recv_with_tag_autograd_profiler",
    "test_isend",
    "test_isend_autograd_profiler",
    "test_irecv",
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    # all_to_all (CPU)
    "test_all_to_all",
    "test_all_to_all_complex",
    "test_all_to_all_full_group",
    "test_all_to_all_group",
    "test_all_to_all_single_equal_split",
    "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_equal_split_group",
    "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all_single_unequal_split_full_group",
    "test_all_to_all_single_unequal_split_group",
    # gather / scatter (CPU)
    "test_gather",
    "test_gather_checks",
    "test_gather_full_group",
    "test_gather_group",
    "test_scatter",
    "test_scatter_checks",
    "test_scatter_complex",
    "test_scatter_full_group",
    "test_scatter_group",
    "test_scatter_object_list",
    # reduce (CPU)
    "test_reduce_sum",
    "test_reduce_sum_twice",
]

# name-gates that only a hard-coded backend passes: reason text must match.
BACKEND_GATES = [
    r"^Only MPI supports (CPU )?all_to_all",
    r"^GLOO Batch Send Recv CPU$",
    r"^Test requires backend \S+ to be one of \{'gloo'\}$",
]


def native_skip(name):
    """The skip torch's decorators set at class-build time (None if none)."""
    f = BASE.__dict__[name]
    if getattr(f, "__unittest_skip__", False):
        return getattr(f, "__unittest_skip_why__", "?")
    return None


def _is_small_ws_wrapper(f):
    """True if f is the wrapper made by common_distributed.skip_if_small_worldsize."""
    from torch.testing._internal.common_distributed import skip_if_small_worldsize

    probe = skip_if_small_worldsize(lambda: None)
    return hasattr(f, "__wrapped__") and getattr(f, "__code__", None) is probe.__code__


def _plain(fn, name):
    def test(self):
        # proof the case ran on the backend under test, not a fallback
        be = dist.get_backend()
        if be != BACKEND:
            raise AssertionError(f"default group backend is {be!r}, not {BACKEND!r}")
        impl = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
        if self.rank == 0:
            print(f"[dtest] {name}: backend={be} impl={impl}", file=sys.stderr, flush=True)
        return fn(self)

    test.__name__ = test.__qualname__ = name
    return test


UNSKIPPED = {}  # name -> what was bypassed


def build_class():
    attrs = {}
    unskip = os.environ.get("DTEST_UNSKIP", "1") == "1"
    small_ws = os.environ.get("DTEST_SMALL_WS", "1") == "1"
    for name in CASES:
        f = BASE.__dict__[name]
        why = native_skip(name)
        bypassed = []
        target = f
        if why is not None:
            if unskip and any(re.search(g, why) for g in BACKEND_GATES):
                bypassed.append(f"backend gate: {why}")
            else:
                continue  # leave torch's skip in place
        if small_ws and _is_small_ws_wrapper(target) and int(os.environ["WORLD_SIZE"]) >= 3:
            target = target.__wrapped__
            bypassed.append("skip_if_small_worldsize (WORLD_SIZE<8)")
        # every case is wrapped (adds the backend check above); skips that are
        # kept stay on f and are not copied, so re-check: keep nothing skipped here
        attrs[name] = _plain(target, name)
        if bypassed:
            UNSKIPPED[name] = bypassed

    def setUp(self):
        TestDistBackend.setUp(self)
        # fork, not spawn: a spawned rank imports torch again (seconds per
        # case on 2 cores); the parent has no process group or threads of
        # Fairring's to inherit.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    attrs["setUp"] = setUp
    cls = type("TestDistBackendWithSpawn", (TestDistBackend, BASE), attrs)
    cls.__module__ = __name__
    return cls


TestDistBackendWithSpawn = build_class()


def main():
    import time
    import unittest
    import json

    names = [n for n in CASES if (not ARGS.k or any(k in n for k in ARGS.k)) and (not ARGS.only or n in ARGS.only)]
    results = {}

    class Res(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            results[test._testMethodName] = ("PASS", "")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            results[test._testMethodName] = ("FAIL", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            results[test._testMethodName] = ("ERROR", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            results[test._testMethodName] = ("SKIP", reason)

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    t0 = time.time()
    times = {}

    runner = unittest.TextTestRunner(verbosity=2, resultclass=Res, stream=sys.stderr)
    for t in suite:
        s = time.time()
        runner.run(t)
        times[t._testMethodName] = time.time() - s
        sys.stderr.flush()
    total = time.time() - t0

    print(f"\n=== backend={BACKEND} world_size={os.environ['WORLD_SIZE']} "
          f"unskip={os.environ['DTEST_UNSKIP']} small_ws_bypass={os.environ['DTEST_SMALL_WS']} "
          f"total {total:.1f}s ===")
    out = {}
    for n in names:
        st, msg = results.get(n, ("NOT RUN", ""))
        nat = native_skip(n)
        note = ""
        if n in UNSKIPPED:
            note = " [bypassed: " + "; ".join(UNSKIPPED[n]) + "]"
        first = ""
        if st in ("FAIL", "ERROR"):
            lines = [ln for ln in msg.splitlines() if ln.strip()]
            # the most informative lines: exception lines from the ranks
            key = [ln for ln in lines if re.search(r"(Error|Exception|exception:|assert|Mismatch|Timing out|timed out)", ln)]
            first = " | ".join((key or lines)[-4:])[:600]
        elif st == "SKIP":
            first = msg
        print(f"{n:50s} {st:6s} {times.get(n, 0):5.1f}s{note} {first}")
        out[n] = {"status": st, "seconds": round(times.get(n, 0), 1),
                  "native_skip": nat, "bypassed": UNSKIPPED.get(n), "message": msg}
    if ARGS.json:
        with open(ARGS.json, "w") as fh:
            json.dump({"backend": BACKEND, "world_size": int(os.environ["WORLD_SIZE"]),
                       "total_s": round(total, 1), "tests": out}, fh, indent=1)
    bad = sum(1 for v in out.values() if v["status"] in ("FAIL", "ERROR", "NOT RUN"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
