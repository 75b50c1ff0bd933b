"""Starting the ranks of a benchmark: one launcher for the microbenchmark and
the DDP benchmark.

Every rank is a fresh ``python -m fairring_py.bench.worker CONFIG`` process with
the environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) plus FAIRRING_NODE_ID = rank // ranks_per_node, so
one code path serves our own launcher, torchrun and mpirun.  In a simulated
cluster (netns.Cluster) each rank runs under ``ip netns exec`` of its node.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

WORKER = "fairring_py.bench.worker"
# After the first rank fails, how long the others get to report their own
# error (they see it through the process group) before they are killed.
FAILURE_GRACE_S = 20.0


class LaunchError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def external_launcher(environ=None) -> Optional[str]:
    """'mpi' when this process is a rank started by mpirun, 'torchrun' when by
    torchrun (or anything else that sets RANK and WORLD_SIZE), else None."""
    env = os.environ if environ is None else environ
    if "OMPI_COMM_WORLD_RANK" in env or "PMIX_RANK" in env:
        return "mpi"
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    return None


def package_path() -> str:
    """The directory holding the fairring_py that runs this launcher, so the
    ranks import the same one (an in-place build or a worktree included)."""
    import fairring_py

    return os.path.dirname(os.path.dirname(os.path.abspath(fairring_py.__file__)))


def base_env(extra: Optional[dict] = None) -> dict:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "FAIRRING_NODE_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([package_path()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # More ranks than cores: one compute thread per rank unless asked otherwise.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def rank_env(rank: int, world: int, ranks_per_node: int, master_addr: str, port: int) -> dict:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % ranks_per_node),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "FAIRRING_NODE_ID": str(rank // ranks_per_node),
    }


def write_config(config: dict) -> str:
    fd, path = tempfile.mkstemp(prefix="fairring-bench-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    return path


def _kill(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def run_ranks(config: dict, nodes: int, ranks_per_node: int, timeout_s: float,
              cluster=None, extra_env: Optional[dict] = None) -> None:
    """Run the job described by ``config`` on nodes x ranks_per_node local
    processes; raise LaunchError unless every rank exits 0 before the deadline.
    Ranks write to this process's stdout/stderr (rank 0 prints the report)."""
    world = nodes * ranks_per_node
    if cluster is not None:
        master_addr = cluster.address(0)
        port = 29500 + os.getpid() % 20000  # a fresh namespace has every port free
    else:
        master_addr = "127.0.0.1"
        port = free_port()
    config_path = write_config(config)
    env0 = base_env(extra_env)
    procs: List[subprocess.Popen] = []
    try:
        for r in range(world):
            env = dict(env0)
            env.update(rank_env(r, world, ranks_per_node, master_addr, port))
            cmd = [sys.executable, "-m", WORKER, config_path]
            if cluster is not None:
                node = r // ranks_per_node
                env.update(cluster.rank_env(node))
                cmd = cluster.exec_prefix(node) + cmd
            # Own session: the whole rank (and anything it forks) can be killed.
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        _wait(procs, timeout_s)
    finally:
        _kill(procs)
        os.unlink(config_path)


def _wait(procs: List[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > FAILURE_GRACE_S):
            alive = [r for r, c in enumerate(codes) if c is None]
            why = f"did not finish within {timeout_s:g} s" if now > deadline else \
                "still running after another rank failed"
            _kill(procs)
            raise LaunchError(f"ranks {alive} {why}; killed (exit codes {[p.returncode for p in procs]})")
        time.sleep(0.05)
    bad = {r: c for r, c in enumerate(codes) if c != 0}
    if bad:
        raise LaunchError(f"ranks failed with exit codes {bad}")


def run_mpirun(config: dict, nodes: int, ranks_per_node: int, timeout_s: float) -> None:
    """Run the job under OpenMPI's mpirun (all ranks on this machine); the
    worker then also times MPI_Allreduce in the same processes."""
    import shutil

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise LaunchError("--mpi needs OpenMPI's mpirun (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise LaunchError("--mpi needs mpi4py (python3 -m pip install mpi4py)") from None
    world = nodes * ranks_per_node
    config = dict(config, mpi=True)
    config_path = write_config(config)
    env = base_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # --bind-to none: the ranks are not pinned, as with our launcher and
    # torchrun (pinning would confine Fairring's and gloo's threads to one core).
    cmd = [mpirun, "-np", str(world), "--oversubscribe", "--bind-to", "none"]
    for k in ("PYTHONPATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "MASTER_ADDR", "MASTER_PORT"):
        cmd += ["-x", k]
    cmd += [sys.executable, "-m", WORKER, config_path]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        _wait([proc], timeout_s)
    except LaunchError as e:
        raise LaunchError(f"mpirun: {e}") from None
    finally:
        _kill([proc])
        os.unlink(config_path)
