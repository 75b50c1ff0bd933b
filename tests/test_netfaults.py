"""Network faults between simulated nodes, each node in its own network
namespace (fairring_py.bench.netns: veth links to a bridge).  Root only.

- Partition: mid-stream, one node's link to the switch goes down; nothing is
  delivered either way and neither side gets an error from the kernel (a
  black hole, as when a switch port or a cable fails).
- A peer that stops reading: one rank's rail thread (the only thread that
  reads its rail sockets) is stopped with ptrace, while the rest of that
  process keeps running.  Its kernel goes on acknowledging until the socket's
  receive buffer is full, then advertises a zero window: its peers' sends
  sit in full send buffers, with no error and no closed connection.  That is
  what a peer whose TCP stops reading looks like from the other side, unlike
  SIGSTOP (which stops the whole process, its node peers see it) or a killed
  process (its connections close).

Every other rank must raise a RuntimeError naming a rank across the fault
within 1.5 x the group's timeout, not before the timeout, after results that
were all right, and then exit cleanly: no hang, no abort.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

import launch
import rank_netfaults

from fairring_py.bench import netns

TIMEOUT_S = 6
NUMEL = 4 * 1024 * 1024  # 16 MiB of float32: 16 slices, several in flight


def _why_unusable():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    try:
        netns.cleanup_leftovers()
        with netns.Cluster(1):  # namespaces, a bridge and a veth link
            pass
    except netns.NetnsError as e:
        return f"cannot build a namespace cluster here: {e}"
    return None


def _why_no_ptrace():
    """The stop-reading test stops a thread with ptrace; a container may
    forbid it even to root."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        _ptrace(_PTRACE_SEIZE, child.pid)
        return None
    except OSError as e:
        return f"ptrace is not allowed here: {e}"
    finally:
        child.kill()
        child.wait()


_WHY = _why_unusable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


# --- ptrace: stop one thread of another process ----------------------------

_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_WALL = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def _ptrace(req, tid):
    if _libc.ptrace(req, tid, None, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({req:#x}, {tid}): {os.strerror(err)}")


def _thread_named(pid, name):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    return int(tid)
        except OSError:
            pass
    raise AssertionError(f"no thread named {name!r} in process {pid}")


class StopThread:
    """Stops one thread (ptrace-stop; the rest of its process runs on) and
    resumes it.  Both must be called from the same thread (the tracer)."""

    def __init__(self, tid):
        self.tid = tid
        self.stopped = False

    def stop(self):
        _ptrace(_PTRACE_SEIZE, self.tid)
        _ptrace(_PTRACE_INTERRUPT, self.tid)
        os.waitpid(self.tid, _WALL)  # it is stopped once this returns
        self.stopped = True

    def resume(self):
        if self.stopped:
            self.stopped = False
            _ptrace(_PTRACE_DETACH, self.tid)


# --- the run ---------------------------------------------------------------

def _run_with_fault(node_of_rank, inject, undo, victim=None):
    """Runs rank_netfaults.stream_until_error on a 2-node namespace cluster,
    calls inject(cluster, pids) once every rank has done 3 right all-reduces,
    and undo() once every rank but the victim has reported its error (or the
    wait is over).  Returns (results, time of the fault)."""
    world = len(node_of_rank)
    netns.cleanup_leftovers()
    with netns.Cluster(2) as cluster, tempfile.TemporaryDirectory(prefix="fairring-test-sync-") as sync:
        box = {}

        def run():
            try:
                box["res"] = launch.run_ranks(
                    rank_netfaults.stream_until_error, [f"n{n}" for n in node_of_rank],
                    args=(TIMEOUT_S, sync, NUMEL), pg_timeout_s=TIMEOUT_S, timeout_s=4 * TIMEOUT_S + 60,
                    rank_env=[cluster.rank_env(n) for n in node_of_rank],
                    netns=[cluster.node_ns[n] for n in node_of_rank], store_addr=cluster.address(0),
                    check=False)
            except BaseException as e:  # noqa: BLE001
                box["exc"] = e

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        t_fault = None
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and runner.is_alive():
                if all(os.path.exists(os.path.join(sync, f"ready{r}")) for r in range(world)):
                    break
                time.sleep(0.02)
            if runner.is_alive() and time.monotonic() < deadline:
                pids = [int(open(os.path.join(sync, f"pid{r}")).read()) for r in range(world)]
                t_fault = time.monotonic()
                inject(cluster, pids)
                survivors = [r for r in range(world) if r != victim]
                wait_until = t_fault + 2 * TIMEOUT_S + 5
                while time.monotonic() < wait_until and runner.is_alive():
                    if all(os.path.exists(os.path.join(sync, f"done{r}")) for r in survivors):
                        break
                    time.sleep(0.05)
        finally:
            undo()
            runner.join(4 * TIMEOUT_S + 90)
        if "exc" in box:
            raise box["exc"]
        assert t_fault is not None, "the ranks never got going:\n" + launch.describe_all(box.get("res", []))
        return box["res"], t_fault


def _check(res, t_fault, blame, victim=None):
    """Every rank raised a RuntimeError naming a rank in blame[rank], in
    [timeout, 1.5 x timeout] after the fault, after right results only; the
    group then fails at once; every rank exits cleanly."""
    problems = []
    for r in res:
        v = r.value
        if "terminate called" in r.output or "Fatal Python error" in r.output:
            problems.append(f"rank {r.rank} aborted:\n{r.output[-2000:]}")
        if not (r.ok and r.exitcode == 0 and not r.hung_at_exit):
            problems.append(f"rank {r.rank} did not finish cleanly:\n{r.describe()}")
            continue
        if v["wrong"] or v["ok"] < 3:
            problems.append(f"rank {r.rank}: {v['ok']} right and {v['wrong']} wrong results before the fault")
        e = v["error"]
        if e is None:
            problems.append(f"rank {r.rank}: no error after the fault ({v['ok']} all-reduces succeeded)")
            continue
        if not e["is_runtime"]:
            problems.append(f"rank {r.rank}: raised {e['type']}, expected RuntimeError")
        if r.rank == victim:
            continue  # its rail thread was stopped: it learns it from its node
        after = e["at"] - t_fault
        if not TIMEOUT_S - 0.5 <= after <= 1.5 * TIMEOUT_S:
            problems.append(f"rank {r.rank}: raised {after:.1f}s after the fault (timeout {TIMEOUT_S}s): "
                            f"{e['msg'][:300]!r}")
        if not any(re.search(rf"\brank {b}\b", e["msg"]) for b in blame[r.rank]):
            problems.append(f"rank {r.rank}: error names none of ranks {blame[r.rank]}: {e['msg'][:400]!r}")
        if not v["later"]["raised"] or v["later"]["elapsed"] > 1.0:
            problems.append(f"rank {r.rank}: next all_reduce on the failed group: {v['later']}")
    return problems


def _fmt(res):
    return "\n".join(f"rank {r.rank}: {r.value!r:.1500}" for r in res)


@pytest.mark.parametrize("node_of_rank", [[0, 0, 1, 1], [0, 1]], ids=["2x2", "2x1"])
def test_partition_mid_stream(node_of_rank):
    """Node 1's link goes down in the middle of a stream of 16 MiB
    all-reduces (and stays down until every rank has exited)."""
    port = "p1"  # node 1's port on the switch

    def inject(cluster, pids):
        subprocess.run(["ip", "-n", cluster.switch, "link", "set", port, "down"], check=True)

    res, t_fault = _run_with_fault(node_of_rank, inject, lambda: None)
    other = {n: [r for r, m in enumerate(node_of_rank) if m != n] for n in (0, 1)}
    blame = {r: other[node_of_rank[r]] for r in range(len(node_of_rank))}
    problems = _check(res, t_fault, blame)
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


def test_peer_stops_reading():
    """Rank 3's rail thread stops (ptrace) in the middle of a stream of
    16 MiB all-reduces on 2x2; its process stays alive.  It is resumed once
    the others have reported their errors."""
    why = _why_no_ptrace()
    if why:
        pytest.skip(why)
    victim = 3
    stopper = {}

    def inject(cluster, pids):
        s = StopThread(_thread_named(pids[victim], "fairring-rail"))
        stopper["s"] = s
        s.stop()

    def undo():
        if "s" in stopper:
            stopper["s"].resume()

    res, t_fault = _run_with_fault([0, 0, 1, 1], inject, undo, victim=victim)
    blame = {r: [victim] for r in range(4)}
    problems = _check(res, t_fault, blame, victim=victim)
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)
