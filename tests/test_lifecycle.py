"""A process group over a long job's life: created and destroyed many times,
used from two threads.  Threads, file descriptors, memory and /dev/shm must
come back to where they started."""
from __future__ import annotations

import tempfile

import pytest

import launch
import rank_lifecycle
from topologies import node_ids, params

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
                problems.append(f"rank {r.rank}: {key} grew from {b[key]} to {a[key]} over the {label}"
                                + (f"; new threads {sorted(set(a['names']) - set(b['names']))}" if key == "threads" else ""))
        if a["rss_mb"] - b["rss_mb"] > RSS_SLACK_MB:
            problems.append(f"rank {r.rank}: RSS grew from {b['rss_mb']:.0f} to {a['rss_mb']:.0f} MiB over the {label}")
    return problems


@pytest.mark.parametrize("nodes", params("1x2", "2x2"))
def test_init_destroy_cycles_leak_nothing(nodes):
    cycles = 30
    with tempfile.TemporaryDirectory(prefix="fairring-test-store-") as d:
        res = launch.run_ranks(rank_lifecycle.init_destroy_cycles, nodes, backend=None, args=(d, cycles),
                               timeout_s=240)
    problems = _check_counts(res, f"{cycles} init/destroy cycles")
    assert not problems, "\n".join(problems)


def test_subgroup_cycles_leak_nothing():
    res = launch.run_ranks(rank_lifecycle.subgroup_cycles, node_ids("2x2"), args=(20,), timeout_s=240)
    problems = _check_counts(res, "20 subgroup cycles")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("n", [4099, 3_000_017], ids=["small-inline", "large-sliced"])
@pytest.mark.parametrize("nodes", params("1x2", "2x2"))
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


def _dead_pid():
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_cleanup_removes_what_crashed_jobs_left():
    """A segment whose creator is gone and that is over a minute old (what a job
    SIGKILLed during group creation leaves) is removed by `python -m
    fairring_py.cleanup` and by the next `import fairring_py`; a young one, and
    one whose creator lives, stay."""
    import os
    import secrets
    import subprocess
    import sys
    import time

    dead = _dead_pid()
    tag = secrets.token_hex(4)

    def segment(name, pid, age_s):
        path = f"/dev/shm/fairring-test{tag}-{name}-node0-p{pid}"
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    stale = segment("stale", dead, 120)
    young = segment("young", dead, 0)
    alive = segment("alive", os.getpid(), 120)
    try:
        out = subprocess.run([sys.executable, "-m", "fairring_py.cleanup"], capture_output=True, text=True,
                             timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert out.returncode == 0, out.stderr
        assert "removed" in out.stdout, out.stdout
        assert not os.path.exists(stale), "the stale segment is still there"
        assert os.path.exists(young) and os.path.exists(alive), "a segment that may be in use was removed"
        stale2 = segment("stale2", dead, 120)
        subprocess.run([sys.executable, "-c", "import fairring_py"], check=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert not os.path.exists(stale2), "import fairring_py did not sweep the stale segment"
    finally:
        for p in (stale, young, alive):
            if os.path.exists(p):
                os.unlink(p)
