"""Multi-process test harness for Fairring.

``run_ranks(fn, node_ids, ...)`` starts one process per rank (see _context:
forked from a server that imported torch once, or a fresh interpreter), gives
rank r ``FAIRRING_NODE_ID=node_ids[r]`` (so that several
nodes are simulated on one machine), initialises the default process group on a
fresh TCP port, runs ``fn(rank, world_size, *args)`` and returns one
``RankResult`` per rank.  A hard deadline kills every rank (the whole run fails,
pytest never hangs); every rank's stdout/stderr is captured to a file and
returned, so failures show what each rank printed.

``on(name, fn, ...)`` runs ``fn`` on the cluster ``name`` of topologies.py
once per test session (``once(key, run)`` for runs of other shapes): every
test asking for it gets the same results, or the same RunFailed.

Ranks that report but do not exit within ``exit_grace_s`` are killed and
flagged ``hung_at_exit``; on the hard deadline every rank first gets SIGUSR1
(faulthandler dumps its Python stacks into its captured output), then SIGKILL.
A run whose TCPStore port was taken in between is retried once.

``fn`` must be a module-level function of an importable module (a test module
is fine: the child gets the parent's ``sys.path``).  It is looked up by name in
the child only *after* the per-rank environment is in place, so environment
variables are seen by everything the module imports.

Starting, waiting for and stopping the processes is fairring_py._ranks, the
launcher the benchmarks use too; what a rank runs is rank_entry.py (which must
not import torch, see there); this module is the tests' side: environments,
logs, results, failures.
"""
from __future__ import annotations

import dataclasses
import os
import queue as queue_mod
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import multiprocessing as mp

import rank_entry
import topologies
from fairring_py import _ranks
from rank_entry import enter_netns  # noqa: F401  (part of this module's API)

BACKEND = os.environ.get("FAIRRING_TEST_BACKEND", "fairring")

# Exit code a rank uses on purpose (tests of dead peers) so that the harness
# can tell a deliberate death from a crash.
DELIBERATE_EXIT = 57

free_port = _ranks.free_port

# Ranks fork from a server process that imported these once (multiprocessing's
# "forkserver"): a rank then starts in tens of milliseconds, not the ~2.5 s of
# CPU a fresh interpreter spends importing torch (the suite starts about two
# thousand ranks on 2 cores).  What those imports read from the environment
# is the server's: torch.distributed reads TORCH_DISTRIBUTED_DEBUG, libgomp
# OMP_NUM_THREADS, when loaded.  So a run whose ranks' environment differs
# from the server's in anything but FAIRRING_* variables (Fairring reads its
# own when a group is created, after the fork) and PYTEST_* ones (pytest's
# note of the current test) gets fresh interpreters
# ("spawn"), as does every run under FAIRRING_TEST_SPAWN=1.
_PRELOAD = ["torch", "torch.distributed", "fairring_py", "launch", "rank_entry"]
_server_env: Optional[dict] = None
# The variables that differ from rank to rank by design (never a reason to spawn).
_RANK_VARS = set(_ranks.rank_env(0, 1, None))


def _context(rank_envs: Sequence[dict]):
    """The multiprocessing context for ranks whose full environments are
    ``rank_envs``."""
    global _server_env
    if os.environ.get("FAIRRING_TEST_SPAWN") == "1":
        return mp.get_context("spawn")
    if _server_env is None:
        from multiprocessing import forkserver

        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = "1"  # what every rank gets (base_env), for libgomp's load
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            forkserver.set_forkserver_preload(_PRELOAD)
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server_env = env
    for e in rank_envs:
        keys = (set(e) | set(_server_env)) - _RANK_VARS
        if any(e.get(k) != _server_env.get(k) for k in keys if not k.startswith(("FAIRRING_", "PYTEST_"))):
            return mp.get_context("spawn")
    return mp.get_context("forkserver")


def list_shm(prefix: str = "fairring-") -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except FileNotFoundError:
        return set()


def shm_left_behind(new: set, tries: int = 4, pause_s: float = 2.0) -> set:
    """Of the fairring-* files ``new`` that appeared during a job, those still
    there after ``tries`` looks ``pause_s`` apart.  Other jobs (the suite runs
    tests in parallel) create segments too, each for the moment between
    creating and unlinking it; only a file that stays is the job's leak."""
    left = set(new)
    for _ in range(tries):
        if not left:
            break
        time.sleep(pause_s)
        left &= list_shm()
    return left


def own_shm_mappings(prefix: str = "/dev/shm/fairring-") -> list:
    """Lines of /proc/self/maps that map a fairring shared-memory segment, as
    (name, deleted) pairs, deduplicated."""
    out = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5]
            if not path.startswith(prefix):
                continue
            deleted = path.endswith(" (deleted)")
            name = path[len("/dev/shm/"):]
            if deleted:
                name = name[: -len(" (deleted)")]
            out[name] = deleted
    return sorted(out.items())


@dataclasses.dataclass
class RankResult:
    rank: int
    ok: bool = False
    value: Any = None
    # set when fn raised: exception type name, str(exc), formatted traceback
    exc_type: Optional[str] = None
    exc_msg: Optional[str] = None
    tb: Optional[str] = None
    exitcode: Optional[int] = None
    reported: bool = False  # a result came back through the queue
    hung_at_exit: bool = False  # reported, but did not exit within exit_grace_s (killed)
    output: str = ""  # captured stdout+stderr of the rank

    def describe(self) -> str:
        s = f"--- rank {self.rank}: ok={self.ok} reported={self.reported} exitcode={self.exitcode}"
        s += " HUNG AT EXIT (killed after the grace period)\n" if self.hung_at_exit else "\n"
        if self.tb:
            s += self.tb
        if not self.ok and not self.reported:
            s += "(rank reported nothing)\n"
        tail = self.output[-4000:]
        if tail.strip():
            s += f"--- rank {self.rank} output (tail):\n{tail}\n"
        return s


class RunFailed(AssertionError):
    pass


def describe_all(results: Sequence[RankResult]) -> str:
    return "\n".join(r.describe() for r in results)


def _port_clash(results) -> bool:
    """The TCPStore port picked by free_port() was taken by someone else in
    between (a rare race with other jobs on the machine)."""
    return any(
        r.tb and "init_process_group" in r.tb and ("ddress already in use" in r.tb or "EADDRINUSE" in r.tb)
        for r in results
    )


def _check(fn: Callable, node_ids, results) -> None:
    bad = [r for r in results if not (r.ok and r.exitcode == 0)]
    if bad:
        raise RunFailed(
            f"run of {fn.__qualname__} on nodes {list(node_ids)} failed on ranks "
            f"{[r.rank for r in bad]}\n" + describe_all(results)
        )


def run_ranks(*a, **kw) -> list:
    """See _run_ranks_once; retried once, with a fresh port, on a TCPStore port clash."""
    kw_once = dict(kw)
    check = kw_once.pop("check", True)
    results = _run_ranks_once(*a, check=False, **kw_once)
    if _port_clash(results):
        results = _run_ranks_once(*a, check=False, **kw_once)
    if check:
        _check(a[0], a[1], results)
    return results


def _log_dir(fn: Callable, world_size: int) -> str:
    """A fresh directory for one run's rank logs (removed once they are read)."""
    # FAIRRING_TEST_LOG_DIR keeps the per-rank logs somewhere known (the GPU
    # check's $OUT), where they survive a session killed mid-run.
    keep = os.environ.get("FAIRRING_TEST_LOG_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{fn.__qualname__}-{world_size}ranks-" if keep else "fairring-test-logs-",
                            dir=keep or None)


def _read_logs(logdir: str, world_size: int) -> list:
    """Each rank's captured output ("" if there is none); the files and the
    directory are removed."""
    out = []
    for r in range(world_size):
        path = os.path.join(logdir, f"rank{r}.log")
        try:
            with open(path, errors="replace") as f:
                out.append(f.read())
        except OSError:
            out.append("")
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        os.rmdir(logdir)
    except OSError:
        pass
    return out


def _run_ranks_once(
    fn: Callable,
    node_ids: Sequence[Optional[str]],
    *,
    timeout_s: float = 120.0,
    env: Optional[dict] = None,
    rank_env: Optional[Sequence[dict]] = None,
    args: tuple = (),
    backend: Optional[str] = BACKEND,
    pg_timeout_s: float = 60.0,
    pg_options_fn: Optional[Callable] = None,
    exit_grace_s: float = 20.0,
    destroy: bool = True,
    check: bool = True,
    netns: Optional[Sequence[str]] = None,
    store_addr: str = "127.0.0.1",
    store_port: Optional[int] = None,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``len(node_ids)`` ranks.

    backend: process group to init before calling fn (None: fn does it).
    env: extra environment for every rank (None values unset a variable);
    rank_env: per-rank extra environment (list, one dict per rank).
    node_ids: FAIRRING_NODE_ID of each rank (None: leave it unset).
    pg_options_fn: module-level ``f(rank, world_size)`` returning the
    ``pg_options`` to pass to init_process_group.
    timeout_s: hard deadline for the whole run (start to every rank's exit);
    on expiry every rank is killed and RunFailed raised.
    check: raise RunFailed unless every rank returned normally and exited 0
    within exit_grace_s of reporting (else see RankResult.hung_at_exit).
    netns: network namespace of each rank (list, one name per rank; None: the
    harness's own); then store_addr must be rank 0's address in its namespace.
    store_port: the TCPStore's port (None: a free one), for processes that
    join the job through its store (reduction servers).
    """
    world_size = len(node_ids)
    fn_ref = (fn.__module__, fn.__qualname__)
    if fn_ref[0] == "__main__":
        raise ValueError("fn must live in an importable module")
    base_env = {"FAIRRING_SOCKET_IFNAME": None, "OMP_NUM_THREADS": "1"}
    base_env.update(env or {})
    rank_envs = [
        _ranks.environment(base_env, rank_env[r] if rank_env is not None else None,
                           _ranks.rank_env(r, world_size, node_ids[r]))
        for r in range(world_size)
    ]
    ctx = _context(rank_envs)
    q = ctx.Queue()
    init = {
        "backend": backend,
        "init_method": f"tcp://{store_addr}:{store_port or free_port()}",
        "pg_timeout_s": pg_timeout_s,
        "pg_options_fn": (pg_options_fn.__module__, pg_options_fn.__qualname__) if pg_options_fn else None,
        "destroy": destroy,
    }
    logdir = _log_dir(fn, world_size)

    results = [RankResult(rank=r) for r in range(world_size)]
    procs = _ranks.RankProcs()
    deadline = time.monotonic() + timeout_s
    pending = set(range(world_size))  # ranks that have not reported
    exited_at = {}

    def all_reported() -> bool:
        while True:
            try:
                msg = q.get_nowait()
            except queue_mod.Empty:
                break
            kind, rank = msg[0], msg[1]
            res = results[rank]
            res.reported = True
            if kind == "ok":
                res.ok = True
                res.value = msg[2]
            else:
                res.exc_type, res.exc_msg, res.tb = msg[2], msg[3], msg[4]
            pending.discard(rank)
        # Ranks that died without reporting: give their queue feeder a
        # moment (a result may still be in flight), then stop waiting.
        now = time.monotonic()
        codes = procs.exitcodes()
        for r in list(pending):
            if codes[r] is not None:
                exited_at.setdefault(r, now)
                if now - exited_at[r] > 1.0:
                    pending.discard(r)
        return not pending

    timed_out = False
    hung_at_exit = []
    try:
        for r in range(world_size):
            procs.fork(ctx, rank_entry.main, name=f"fairring-rank{r}",
                       args=(q, r, world_size, rank_envs[r], fn_ref, tuple(args), init,
                             os.path.join(logdir, f"rank{r}.log"), netns[r] if netns else None))
        timed_out = procs.wait(deadline, done=all_reported) == "deadline"
        # Every rank reported (or died): wait for them to exit.
        if not timed_out:
            hung_at_exit = procs.join(min(deadline, time.monotonic() + exit_grace_s))
    finally:
        # On the deadline (or any error here), stacks first, then SIGKILL.
        procs.stop(dump_s=1.0)
        for r, code in enumerate(procs.exitcodes()):
            results[r].exitcode = code
            results[r].hung_at_exit = r in hung_at_exit
        for r, output in enumerate(_read_logs(logdir, world_size)):
            results[r].output = output
        try:
            q.close()
            q.cancel_join_thread()
        except Exception:
            pass

    if timed_out:
        stuck = [r.rank for r in results if not r.reported or r.exitcode not in (0,)]
        raise RunFailed(
            f"run of {fn.__qualname__} on nodes {list(node_ids)} did not finish within "
            f"{timeout_s:.0f}s (ranks not reported or not exited cleanly: {stuck}); all killed\n"
            + describe_all(results)
        )
    if check:
        _check(fn, node_ids, results)
    return results


def run_once(cache: dict, key, run: Callable):
    """run() once per key for the whole test session: its result, or the
    RunFailed it raised, is kept in `cache` and given (raised) again to every
    test that asks for the same key."""
    if key not in cache:
        try:
            cache[key] = ("ok", run())
        except RunFailed as e:
            cache[key] = ("failed", e)
    kind, val = cache[key]
    if kind == "failed":
        raise val
    return val


_session_runs: dict = {}


def once(key, run: Callable):
    """run() once per key for the whole test session (run_once on one cache
    shared by every test file: a key names its caller's run, e.g. a tuple
    starting with the file's name)."""
    return run_once(_session_runs, key, run)


def on(name: str, fn: Callable, *, args: tuple = (), env: Optional[dict] = None, **kw) -> list:
    """run_ranks(fn) on the registry's topology `name` (tests/topologies.py:
    its node ids, its environment and `env` on top), once per session for
    the same fn, topology and arguments; every later call gets the same
    results, or the same RunFailed raised again."""
    t = topologies.get(name)
    key = ("on", fn.__module__, fn.__qualname__, name, repr(args), repr(env), repr(sorted(kw.items())))
    return once(key, lambda: run_ranks(fn, list(t.ids), args=args, env={**t.env, **(env or {})}, **kw))


def values(results: Sequence[RankResult]) -> list:
    return [r.value for r in results]
