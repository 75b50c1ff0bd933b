"""A process group over a long job's life: created and destroyed many times,
used from two threads.  Threads, file descriptors, memory and /dev/shm must
come back to where they started."""
from __future__ import annotations

import tempfile

import pytest

import launch
import rank_lifecycle

# Headroom over the start: allocator pools and import caches settle within a
# few MiB; a leak of a group's staging (MiBs per group) would show at once.
RSS_SLACK_MB = 40


def _check_counts(res, label):
    problems = []
    for r in res:
        v = r.value
        if not v["ok"]:
            problems.append(f"rank {r.rank}: a collective gave a wrong result during the {label}")
        b, a = v["before"], v["after"]
        for key in ("threads", "fds", "shm"):
            if a[key] > b[key]:
                problems.append(f"rank {r.rank}: {key} grew from {b[key]} to {a[key]} over the {label}")
        if a["rss_mb"] - b["rss_mb"] > RSS_SLACK_MB:
            problems.append(f"rank {r.rank}: RSS grew from {b['rss_mb']:.0f} to {a['rss_mb']:.0f} MiB over the {label}")
    return problems


@pytest.mark.parametrize("nodes", [["a", "a"], ["a", "a", "b", "b"]], ids=["1x2", "2x2"])
def test_init_destroy_cycles_leak_nothing(nodes):
    cycles = 30
    with tempfile.TemporaryDirectory(prefix="fairring-test-store-") as d:
        res = launch.run_ranks(rank_lifecycle.init_destroy_cycles, nodes, backend=None, args=(d, cycles),
                               timeout_s=240)
    problems = _check_counts(res, f"{cycles} init/destroy cycles")
    assert not problems, "\n".join(problems)


def test_subgroup_cycles_leak_nothing():
    res = launch.run_ranks(rank_lifecycle.subgroup_cycles, ["a", "a", "b", "b"], args=(20,), timeout_s=240)
    problems = _check_counts(res, "20 subgroup cycles")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("n", [4099, 3_000_017], ids=["small-inline", "large-sliced"])
@pytest.mark.parametrize("nodes", [["a", "a"], ["a", "a", "b", "b"]], ids=["1x2", "2x2"])
def test_two_threads_on_one_group(nodes, n):
    res = launch.run_ranks(rank_lifecycle.two_threads, nodes, args=(20, n), timeout_s=180)
    problems = []
    for r in res:
        v = r.value
        problems += [f"rank {r.rank}: {e}" for e in v["errors"]]
        if v["wrong"]:
            problems.append(f"rank {r.rank}: {v['wrong']} wrong results")
        if not v["after"]:
            problems.append(f"rank {r.rank}: the group was broken afterwards")
    assert not problems, "\n".join(problems)
