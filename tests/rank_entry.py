"""The start of a rank of the test harness (launch.run_ranks): what the rank
process runs first, then the test's function, then the result back to the
harness through the queue.

It imports nothing that imports torch (fairring_py does), because a spawned
rank imports this module first and must not import torch before its own
environment is in place (torch and libgomp read some of it once, when
loaded), nor start a thread before it enters its network namespace.
"""
from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import sys
import traceback
from typing import Optional


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


def capture_output(log_path: str) -> None:
    """Send everything this process writes to ``log_path``, at the fd level
    (C++ logs too)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def main(q, rank: int, world_size: int, env: dict, fn_ref: tuple, args: tuple, init: dict,
         log_path: str, netns: Optional[str]) -> None:
    """Rank ``rank``: ``env`` is its whole environment (RANK, WORLD_SIZE and
    FAIRRING_NODE_ID included).  Puts ("ok", rank, value) or ("err", rank,
    type name, message, traceback) on ``q``."""
    capture_output(log_path)
    # A simulated node of the namespace cluster: enter its network namespace
    # before anything opens a socket (no thread exists yet, so every thread
    # the rank starts later lives there too).
    if netns:
        enter_netns(netns)
    # On a hang the harness sends SIGUSR1 (fairring_py._ranks.DUMP_SIGNAL)
    # before killing: dump Python stacks.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # FAIRRING_TEST_DUMP_AFTER=<s>: also dump them by themselves after that long.
    if os.environ.get("FAIRRING_TEST_DUMP_AFTER"):
        faulthandler.dump_traceback_later(float(os.environ["FAIRRING_TEST_DUMP_AFTER"]), exit=False)

    # The whole environment, as a fresh interpreter started now would have it
    # (a forked rank starts with the fork server's).
    os.environ.clear()
    os.environ.update(env)

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
        q.put(("ok", rank, value))
    except BaseException as e:  # noqa: BLE001
        q.put(("err", rank, type(e).__name__, str(e), traceback.format_exc()))
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
