"""Multi-process test harness for Fairring.

``run_ranks(fn, node_ids, ...)`` starts one process per rank (see _context:
forked from a server that imported torch once, or a fresh interpreter), gives
rank r ``FAIRRING_NODE_ID=node_ids[r]`` (so that several
nodes are simulated on one machine), initialises the default process group on a
fresh TCP port, runs ``fn(rank, world_size, *args)`` and returns one
``RankResult`` per rank.  A hard deadline kills every rank (the whole run fails,
pytest never hangs); every rank's stdout/stderr is captured to a file and
returned, so failures show what each rank printed.

Ranks that report but do not exit within ``exit_grace_s`` are killed and
flagged ``hung_at_exit``; on the hard deadline every rank first gets SIGUSR1
(faulthandler dumps its Python stacks into its captured output), then SIGKILL.
A run whose TCPStore port was taken in between is retried once.

``fn`` must be a module-level function of an importable module (a test module
is fine: the child gets the parent's ``sys.path``).  It is looked up by name in
the child only *after* the per-rank environment is in place, so environment
variables are seen by everything the module imports.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import queue as queue_mod
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import multiprocessing as mp

BACKEND = os.environ.get("FAIRRING_TEST_BACKEND", "fairring")

# Exit code a rank uses on purpose (tests of dead peers) so that the harness
# can tell a deliberate death from a crash.
DELIBERATE_EXIT = 57


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
_PRELOAD = ["torch", "torch.distributed", "fairring_py", "launch"]
_server_env: Optional[dict] = None


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
        keys = (set(e) | set(_server_env)) - {"FAIRRING_NODE_ID", "RANK", "WORLD_SIZE"}
        if any(e.get(k) != _server_env.get(k) for k in keys if not k.startswith(("FAIRRING_", "PYTEST_"))):
            return mp.get_context("spawn")
    return mp.get_context("forkserver")


def list_shm(prefix: str = "fairring-") -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except FileNotFoundError:
        return set()


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


def _rank_main(
    q,
    rank: int,
    world_size: int,
    node_id: Optional[str],
    env: dict,
    fn_ref: tuple,
    args: tuple,
    init: dict,
    log_path: str,
) -> None:
    # Capture everything this rank writes, at the fd level (C++ logs too).
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    # A simulated node of the namespace cluster: enter its network namespace
    # before anything opens a socket (no thread exists yet, so every thread
    # the rank starts later lives there too).
    if init.get("netns"):
        enter_netns(init["netns"][rank])
    # On a hang the harness sends SIGUSR1 before killing: dump Python stacks.
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # FAIRRING_TEST_DUMP_AFTER=<s>: also dump them by themselves after that long.
    if os.environ.get("FAIRRING_TEST_DUMP_AFTER"):
        faulthandler.dump_traceback_later(float(os.environ["FAIRRING_TEST_DUMP_AFTER"]), exit=False)

    # The whole environment, as a fresh interpreter started now would have it
    # (a forked rank starts with the fork server's).
    os.environ.clear()
    os.environ.update(env)
    if node_id is not None:
        os.environ["FAIRRING_NODE_ID"] = node_id
    else:
        os.environ.pop("FAIRRING_NODE_ID", None)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)

    def report(msg):
        q.put(msg)

    try:
        import torch  # noqa: F401
        import torch.distributed as dist

        backend = init.get("backend")
        if backend == "fairring":
            import fairring_py  # noqa: F401  registers the backend
        mod_name, qualname = fn_ref
        obj = importlib.import_module(mod_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        fn = obj
        if backend is not None:
            from datetime import timedelta

            kwargs = {}
            if init.get("pg_options_fn") is not None:
                m, n = init["pg_options_fn"]
                kwargs["pg_options"] = getattr(importlib.import_module(m), n)(rank, world_size)
            dist.init_process_group(
                backend,
                rank=rank,
                world_size=world_size,
                init_method=init["init_method"],
                timeout=timedelta(seconds=init["pg_timeout_s"]),
                **kwargs,
            )
        value = fn(rank, world_size, *args)
        report(("ok", rank, value))
    except BaseException as e:  # noqa: BLE001
        report(("err", rank, type(e).__name__, str(e), traceback.format_exc()))
        # Still try to exit cleanly below.
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        q.close()
        q.join_thread()
    except Exception:
        pass
    if init.get("destroy", True):
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:
            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()


def enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (of ``ip netns``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _port_clash(results) -> bool:
    """The TCPStore port picked by free_port() was taken by someone else in
    between (a rare race with other jobs on the machine)."""
    return any(
        r.tb and "init_process_group" in r.tb and ("ddress already in use" in r.tb or "EADDRINUSE" in r.tb)
        for r in results
    )


def run_ranks(*a, **kw) -> list:
    """See _run_ranks_once; retried once, with a fresh port, on a TCPStore port clash."""
    kw_once = dict(kw)
    check = kw_once.pop("check", True)
    results = _run_ranks_once(*a, check=False, **kw_once)
    if _port_clash(results):
        results = _run_ranks_once(*a, check=False, **kw_once)
    if check:
        bad = [r for r in results if not (r.ok and r.exitcode == 0)]
        if bad:
            fn, node_ids = a[0], a[1]
            raise RunFailed(
                f"run of {fn.__qualname__} on nodes {list(node_ids)} failed on ranks "
                f"{[r.rank for r in bad]}\n" + describe_all(results)
            )
    return results


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
    """
    world_size = len(node_ids)
    base_env = {"FAIRRING_SOCKET_IFNAME": None, "OMP_NUM_THREADS": "1"}
    base_env.update(env or {})
    rank_envs = []
    for r in range(world_size):
        e = dict(os.environ)
        for k, v in list(base_env.items()) + list((rank_env[r] if rank_env is not None else {}).items()):
            if v is None:
                e.pop(k, None)
            else:
                e[k] = str(v)
        rank_envs.append(e)
    ctx = _context(rank_envs)
    q = ctx.Queue()
    port = free_port()
    # FAIRRING_TEST_LOG_DIR keeps the per-rank logs somewhere known (the GPU check's $OUT).
    keep = os.environ.get("FAIRRING_TEST_LOG_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
    logdir = tempfile.mkdtemp(prefix=f"{fn.__qualname__}-{len(node_ids)}ranks-" if keep else "fairring-test-logs-",
                              dir=keep or None)
    init = {
        "backend": backend,
        "init_method": f"tcp://{store_addr}:{port}",
        "pg_timeout_s": pg_timeout_s,
        "pg_options_fn": (pg_options_fn.__module__, pg_options_fn.__qualname__) if pg_options_fn else None,
        "destroy": destroy,
        "netns": list(netns) if netns else None,
    }
    fn_ref = (fn.__module__, fn.__qualname__)
    if fn_ref[0] == "__main__":
        raise ValueError("fn must live in an importable module")

    results = [RankResult(rank=r) for r in range(world_size)]
    procs = []
    log_paths = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    hung_at_exit = []
    try:
        for r in range(world_size):
            e = rank_envs[r]
            log_path = os.path.join(logdir, f"rank{r}.log")
            log_paths.append(log_path)
            p = ctx.Process(
                target=_rank_main,
                args=(q, r, world_size, node_ids[r], e, fn_ref, tuple(args), init, log_path),
                name=f"fairring-rank{r}",
                daemon=True,
            )
            p.start()
            procs.append(p)

        pending = set(range(world_size))
        exited_at = {}
        while True:
            now = time.monotonic()
            if now > deadline:
                timed_out = True
                break
            try:
                msg = q.get(timeout=0.2)
            except queue_mod.Empty:
                msg = None
            if msg is not None:
                kind, rank = msg[0], msg[1]
                res = results[rank]
                res.reported = True
                if kind == "ok":
                    res.ok = True
                    res.value = msg[2]
                else:
                    res.exc_type, res.exc_msg, res.tb = msg[2], msg[3], msg[4]
                pending.discard(rank)
                continue
            # Ranks that died without reporting: give their queue feeder a
            # moment (a result may still be in flight), then stop waiting.
            for r in list(pending):
                if not procs[r].is_alive():
                    exited_at.setdefault(r, now)
                    if now - exited_at[r] > 1.0:
                        pending.discard(r)
            if not pending:
                break
        # Every rank reported (or died): wait for them to exit.
        if not timed_out:
            exit_deadline = min(deadline, time.monotonic() + exit_grace_s)
            for p in procs:
                p.join(max(0.0, exit_deadline - time.monotonic()))
            for r, p in enumerate(procs):
                if p.is_alive():
                    hung_at_exit.append(r)
    finally:
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if alive:
            time.sleep(1.0)
        for p in procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            p.join(10)
        for r, p in enumerate(procs):
            results[r].exitcode = p.exitcode
            results[r].hung_at_exit = r in hung_at_exit
        for r, path in enumerate(log_paths):
            try:
                with open(path, errors="replace") as f:
                    results[r].output = f.read()
            except OSError:
                pass
        try:
            q.close()
            q.cancel_join_thread()
        except Exception:
            pass
        for path in log_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(logdir)
        except OSError:
            pass

    if timed_out:
        stuck = [r.rank for r in results if not r.reported or r.exitcode not in (0,)]
        raise RunFailed(
            f"run of {fn.__qualname__} on nodes {list(node_ids)} did not finish within "
            f"{timeout_s:.0f}s (ranks not reported or not exited cleanly: {stuck}); all killed\n"
            + describe_all(results)
        )
    if check:
        bad = [r for r in results if not (r.ok and r.exitcode == 0)]
        if bad:
            raise RunFailed(
                f"run of {fn.__qualname__} on nodes {list(node_ids)} failed on ranks "
                f"{[r.rank for r in bad]}\n" + describe_all(results)
            )
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


def values(results: Sequence[RankResult]) -> list:
    return [r.value for r in results]
