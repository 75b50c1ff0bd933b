"""The processes of a job's ranks: started, watched against one deadline,
stopped together.  One launcher under both the test harness (tests/launch.py:
ranks forked from a multiprocessing server, results back through a queue) and
the benchmarks (bench/launch.py: each rank a fresh ``python -m`` process).

What is here: a free port for the rendezvous, a rank's environment (the
launcher's, updated, plus the variables that give the rank its place), the
start of each rank, the wait (every rank done, the deadline, or the others
still running a grace period after one failed), and the stop: SIGKILL to
whatever still runs, optionally after SIGUSR1 (a rank that registered
faulthandler for it prints its Python stacks first).  What runs inside a rank,
and how a rank's failure is reported, stays with the callers.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from typing import Callable, List, Optional, Tuple

# Sent before SIGKILL when a stop asks for stacks: a rank that called
# faulthandler.register(DUMP_SIGNAL, all_threads=True) dumps them.
DUMP_SIGNAL = signal.SIGUSR1
# How long a stop waits for each killed rank to be reaped.
REAP_S = 10.0
# Every variable rank_env() may set.
PLACE_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "FAIRRING_NODE_ID")


def _ephemeral_ports() -> Tuple[int, int]:
    """The kernel's range for the ports it picks itself (bind to 0, connect)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bind(host: str, port: int) -> Optional[int]:
    """The port a socket bound to ``port`` got (0: the kernel's pick), or None
    if it could not bind; the socket is closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return None
        return s.getsockname()[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, at random below the kernel's
    ephemeral range: the ports the kernel hands out (every listener bound to
    port 0, every outgoing connection, of this job and of any other) never
    take it before the rendezvous binds it, as they could a port the kernel
    picked; only another caller of this could, one chance in thousands (the
    tests retry a run once when that happens)."""
    lo, _ = _ephemeral_ports()
    first = 10000
    if lo - first >= 1000:
        pick = random.SystemRandom()
        for _ in range(64):
            port = _bind(host, pick.randrange(first, lo))
            if port is not None:
                return port
    port = _bind(host, 0)
    if port is None:
        raise OSError(f"no TCP port to bind on {host}")
    return port


def rank_env(rank: int, world: int, node_id, ranks_per_node: Optional[int] = None,
             master: Optional[Tuple[str, int]] = None) -> dict:
    """The variables that give a rank its place: RANK, WORLD_SIZE and
    FAIRRING_NODE_ID (None: unset, Fairring then finds the node itself); with
    ``ranks_per_node`` also LOCAL_RANK and LOCAL_WORLD_SIZE, and with
    ``master`` (address, port) MASTER_ADDR and MASTER_PORT, as torchrun sets
    them for an env:// rendezvous."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "FAIRRING_NODE_ID": None if node_id is None else str(node_id)}
    if ranks_per_node:
        env.update(LOCAL_RANK=str(rank % ranks_per_node), LOCAL_WORLD_SIZE=str(ranks_per_node))
    if master is not None:
        env.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
    return env


def environment(*updates: Optional[dict], base: Optional[dict] = None) -> dict:
    """``base`` (default: this process's environment) with each of ``updates``
    applied in turn: None unsets a variable, any other value is made a string."""
    env = dict(os.environ if base is None else base)
    for u in updates:
        for k, v in (u or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
    return env


class RankProcs:
    """The processes of one run's ranks, in rank order: either
    multiprocessing.Process (fork) or subprocess.Popen (spawn)."""

    def __init__(self):
        self._procs: list = []

    def __len__(self) -> int:
        return len(self._procs)

    def fork(self, ctx, target: Callable, args: tuple, name: str) -> None:
        """Start ``target(*args)`` as a process of multiprocessing context ``ctx``."""
        p = ctx.Process(target=target, args=args, name=name, daemon=True)
        p.start()
        self._procs.append(p)

    def spawn(self, cmd: List[str], env: dict) -> None:
        """Start ``cmd``.  In a session of its own, so that a stop kills the
        rank and anything it started (``ip netns exec``'s child, mpirun's ranks)."""
        self._procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))

    def exitcodes(self) -> List[Optional[int]]:
        """Each rank's exit status (negative: killed by that signal), None while it runs."""
        return [_poll(p) for p in self._procs]

    def running(self) -> List[int]:
        return [r for r, c in enumerate(self.exitcodes()) if c is None]

    def wait(self, deadline: float, done: Optional[Callable[[], bool]] = None,
             failure_grace_s: Optional[float] = None, poll_s: float = 0.05) -> Optional[str]:
        """Wait until ``done()`` (default: every rank has exited) and return
        None; or return "deadline" once time.monotonic() passes ``deadline``, or
        "failure" when ranks still run ``failure_grace_s`` after one exited
        non-zero (the grace lets the others report their own error, which they
        see through the process group).  Kills nothing: that is stop()."""
        failed_at = None
        while True:
            codes = self.exitcodes()
            if done() if done is not None else all(c is not None for c in codes):
                return None
            now = time.monotonic()
            if now > deadline:
                return "deadline"
            if failure_grace_s is not None:
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = now
                if failed_at is not None and now - failed_at > failure_grace_s:
                    return "failure"
            time.sleep(poll_s)

    def join(self, until: float) -> List[int]:
        """Wait for every rank to exit, until time.monotonic() reaches
        ``until``; returns the ranks still running then."""
        for p in self._procs:
            _join(p, max(0.0, until - time.monotonic()))
        return self.running()

    def stop(self, dump_s: float = 0.0) -> None:
        """Kill every rank that still runs and reap them all.  With ``dump_s``,
        they first get DUMP_SIGNAL and that long to print their stacks."""
        if dump_s and self._signal(DUMP_SIGNAL):
            time.sleep(dump_s)
        self._signal(signal.SIGKILL)
        for p in self._procs:
            _join(p, REAP_S)

    def _signal(self, sig: int) -> int:
        """Send ``sig`` to every rank still running (its whole session for a
        spawned one); returns how many were sent it."""
        sent = 0
        for p in self._procs:
            if _poll(p) is None:
                try:
                    if isinstance(p, subprocess.Popen):
                        os.killpg(p.pid, sig)
                    else:
                        os.kill(p.pid, sig)
                    sent += 1
                except ProcessLookupError:
                    pass
        return sent


def _poll(p) -> Optional[int]:
    return p.poll() if isinstance(p, subprocess.Popen) else p.exitcode


def _join(p, timeout: float) -> None:
    if isinstance(p, subprocess.Popen):
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    else:
        p.join(timeout)
