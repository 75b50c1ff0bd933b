"""An all_reduce of more than 2^31 elements (uint8: about 2.1 GB per rank).

Every size on the way (element counts, byte offsets of slices, chunks and
shards, wire lengths) must be 64-bit: a count truncated to 32 bits would
reduce the wrong elements or only part of the tensor.  The tensor holds a
pattern whose period (65521, a prime) divides neither 2^31 nor any slice
size, so data landing at a wrapped or shifted offset shows as wrong values;
the whole result is compared with the reference.

About 15-25 s per topology on a 2-core machine.  FAIRRING_TEST_SKIP_LARGE=1
skips them; they also skip when the machine lacks the memory.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import launch
from topologies import params

NUMEL = 2**31 + 4099
PERIOD = 65521
ROWS_PER_CHECK = 1024  # 64 MiB of the result compared at a time


def _pattern(rank):
    i = torch.arange(PERIOD, dtype=torch.int64)
    return ((i * 37 + rank * 11 + 5) % 256).to(torch.uint8)


def _fill(x, pat):
    m = x.numel() // PERIOD
    x[: m * PERIOD].view(m, PERIOD).copy_(pat.expand(m, PERIOD))
    x[m * PERIOD:].copy_(pat[: x.numel() - m * PERIOD])


def big_uint8(rank, world):
    x = torch.empty(NUMEL, dtype=torch.uint8)
    _fill(x, _pattern(rank))
    # Marks around 2^31 and at the end: element e holds (rank + e) % 256.
    marks = [2**31 - 1, 2**31, 2**31 + 1, NUMEL - 1]
    for e in marks:
        x[e] = (rank + e) % 256
    t0 = time.monotonic()
    dist.all_reduce(x)
    took = time.monotonic() - t0
    want = torch.zeros(PERIOD, dtype=torch.int64)
    for r in range(world):
        want += _pattern(r).to(torch.int64)
    want = (want % 256).to(torch.uint8)
    bad_rows = []
    m = NUMEL // PERIOD
    rows = x[: m * PERIOD].view(m, PERIOD)
    for start in range(0, m, ROWS_PER_CHECK):
        block = rows[start: start + ROWS_PER_CHECK]
        ok = block == want
        # the marks are checked on their own below
        if not bool(ok.all()):
            bad = (~ok).nonzero()[:5]
            for row, col in bad.tolist():
                e = (start + row) * PERIOD + col
                if e not in marks:
                    bad_rows.append(e)
        if len(bad_rows) > 5:
            break
    tail = x[m * PERIOD:]
    tail_want = want[: tail.numel()]
    for j in (~(tail == tail_want)).nonzero().flatten().tolist():
        if m * PERIOD + j not in marks:
            bad_rows.append(m * PERIOD + j)
    wrong_marks = {e: int(x[e]) for e in marks if int(x[e]) != sum((r + e) % 256 for r in range(world)) % 256}
    return {"took": took, "wrong_at": bad_rows[:10], "wrong_marks": wrong_marks}


def _mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.parametrize("nodes", params("1x2", "2x1"))
def test_all_reduce_of_more_than_2_31_elements(nodes):
    if os.environ.get("FAIRRING_TEST_SKIP_LARGE", "0") not in ("", "0"):
        pytest.skip("FAIRRING_TEST_SKIP_LARGE is set")
    need = len(nodes) * (NUMEL + (512 << 20))
    if _mem_available() < need:
        pytest.skip(f"needs about {need / 2**30:.1f} GiB of available memory")
    res = launch.run_ranks(big_uint8, nodes, timeout_s=240)
    problems = []
    for r in res:
        v = r.value
        if v["wrong_at"] or v["wrong_marks"]:
            problems.append(f"rank {r.rank}: wrong result at elements {v['wrong_at']}, marks {v['wrong_marks']}")
    assert not problems, "\n".join(problems)
