"""The launch of a benchmark, both sides: starting the ranks (one launcher for
the microbenchmark and the DDP benchmark), a rank's own start (its place in the
job, its process groups), and the run metadata every report records.

Every rank is a fresh ``python -m fairring_py.bench.worker CONFIG`` process with
the environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) plus FAIRRING_NODE_ID = rank // ranks_per_node, so
one code path serves our own launcher, torchrun and mpirun.  In a simulated
cluster (netns.Cluster) each rank runs under ``ip netns exec`` of its node.
The processes themselves (start, deadline, kill) are fairring_py._ranks, the
launcher the test harness uses too.

A config with ``servers`` M > 0 (the microbenchmark's --servers) also gets M
dedicated reduction servers (``python -m fairring_py.server``), started before
the ranks (they wait for the job's store) and stopped with them; in a
simulated cluster each runs in its own namespace (netns.Cluster's servers).

The job modules (worker.py: the microbenchmark; the training benchmarks)
import this one; this one imports no job, only netns, so the package has no
import cycle.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

import fairring_py  # registers the "fairring" backend
from fairring_py import _ranks
from fairring_py._ranks import REAP_S, free_port

from . import netns

WORKER = "fairring_py.bench.worker"
SERVER = "fairring_py.server"
# After the first rank fails, how long the others get to report their own
# error (they see it through the process group) before they are killed.
FAILURE_GRACE_S = 20.0
# After the ranks have ended, how long the reduction servers get to notice
# that the job's store is gone (they look every second) and exit by themselves.
SERVER_EXIT_S = 10.0
# A server stopped by us gets SIGTERM and this long to print its summary line
# (what it served) before SIGKILL.
SERVER_TERM_S = 3.0


class LaunchError(RuntimeError):
    pass


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
    return os.path.dirname(os.path.dirname(os.path.abspath(fairring_py.__file__)))


def exit_on_signals() -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so every finally block (ranks killed,
    namespaces deleted) runs."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def adopt_external(cfg: dict, kind: str, ranks_per_node: Optional[int]) -> None:
    """This process is a rank started by torchrun or mpirun (``kind``): record
    it in the config.  Nodes are the real machines, unless ``ranks_per_node``
    K asks to simulate them (rank r on node r // K)."""
    env = os.environ
    cfg.update(launcher=kind, mpi=kind == "mpi", nodes=None, ranks_per_node=None)
    if ranks_per_node:
        cfg["ranks_per_node"] = ranks_per_node
        cfg["simulate_ranks_per_node"] = ranks_per_node  # read by Ranks under mpirun
        if kind == "torchrun":
            env["FAIRRING_NODE_ID"] = str(int(env["RANK"]) // ranks_per_node)
            cfg["nodes"] = -(-int(env["WORLD_SIZE"]) // ranks_per_node)


def base_env(extra: Optional[dict] = None) -> dict:
    # Not this process's place, if a launcher gave it one (the ranks get their own).
    env = _ranks.environment(dict.fromkeys(_ranks.PLACE_VARS + ("TORCHELASTIC_RUN_ID",)))
    env["PYTHONPATH"] = os.pathsep.join([package_path()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # More ranks than cores: one compute thread per rank unless asked otherwise.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def rank_env(rank: int, world: int, ranks_per_node: int, master_addr: str, port: int) -> dict:
    return _ranks.rank_env(rank, world, rank // ranks_per_node, ranks_per_node, (master_addr, port))


def write_config(config: dict) -> str:
    fd, path = tempfile.mkstemp(prefix="fairring-bench-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    return path


class Servers:
    """The reduction servers of one run, each ``python -m fairring_py.server``
    in a session of its own (a stop reaches ``ip netns exec``'s child too)."""

    def __init__(self):
        self.procs: List[subprocess.Popen] = []

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self.procs]

    def start(self, count: int, store: str, env: dict, cluster=None, connect_timeout_s: float = 300.0,
              threads: int = 1) -> None:
        """Start ``count`` servers that join the job whose store is at
        ``store`` (HOST:PORT; it may come up later), with ``threads``
        reduction threads each (one per rail: a rank per node).  In a
        cluster, server j runs in its namespace on its link; else on
        loopback, where every simulated node reaches it."""
        if cluster is not None and len(cluster.server_ns) < count:
            raise LaunchError(f"{count} reduction servers need a netns.Cluster made with servers={count}")
        for j in range(count):
            ifname = "lo" if cluster is None else cluster.ifname
            cmd = [sys.executable, "-m", SERVER, "--store", store, "--ifname", ifname, "--threads", str(threads),
                   "--connect-timeout", f"{connect_timeout_s:g}"]
            if cluster is not None:
                cmd = cluster.server_exec_prefix(j) + cmd
            self.procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))

    def failed(self) -> dict:
        """{server: exit status} of those that exited non-zero (or by a
        signal): a server only exits 0 on its own, once the job has ended."""
        return {j: p.poll() for j, p in enumerate(self.procs) if p.poll() not in (None, 0)}

    def expect_exit(self, timeout_s: float) -> None:
        """The job has ended: every server should exit by itself, status 0,
        within ``timeout_s``.  Says so on stderr when one does not (it is
        then stopped); the run's results stand."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        alive = [j for j, p in enumerate(self.procs) if p.poll() is None]
        bad = self.failed()
        if alive:
            print(f"fairring bench: reduction server process(es) {alive} still running {timeout_s:g} s after "
                  "the job ended (a server should exit once the job's store is gone); stopping them",
                  file=sys.stderr, flush=True)
        if bad:
            print(f"fairring bench: reduction server process(es) exited with status {bad}", file=sys.stderr,
                  flush=True)

    def stop(self) -> None:
        """SIGTERM to every server still running, SIGKILL after SERVER_TERM_S; reap them all."""
        running = [p for p in self.procs if p.poll() is None]
        for sig, grace in ((signal.SIGTERM, SERVER_TERM_S), (signal.SIGKILL, REAP_S)):
            for p in running:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            for p in running:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            running = [p for p in running if p.poll() is None]
            if not running:
                return


def run_ranks(config: dict, nodes: int, ranks_per_node: int, timeout_s: float,
              cluster=None, extra_env: Optional[dict] = None) -> None:
    """Run the job described by ``config`` on nodes x ranks_per_node local
    processes, and its ``servers`` reduction servers if it names some; raise
    LaunchError unless every rank exits 0 before the deadline.  Ranks and
    servers write to this process's stdout/stderr (rank 0 prints the report)."""
    sizes = config.get("node_sizes") or [ranks_per_node] * nodes
    node_of = [n for n, k in enumerate(sizes) for _ in range(k)]  # ranks in order
    world = len(node_of)
    if cluster is not None:
        master_addr = cluster.address(0)
        port = 29500 + os.getpid() % 20000  # a fresh namespace has every port free
    else:
        master_addr = "127.0.0.1"
        port = free_port()
    env0 = base_env(extra_env)
    procs = _ranks.RankProcs()
    servers = Servers()
    config_path = None
    try:
        # Servers first: they wait for the store, and the ranks' config
        # carries their pids (rank 0 reads their CPU time around each sample).
        servers.start(int(config.get("servers") or 0), f"{master_addr}:{port}", env0, cluster,
                      connect_timeout_s=min(timeout_s, 300.0), threads=ranks_per_node)
        config_path = write_config(dict(config, server_pids=servers.pids) if servers.procs else config)
        for r in range(world):
            node = node_of[r]
            here = sizes[node]
            place = _ranks.rank_env(r, world, node, None, (master_addr, port))
            place.update(LOCAL_RANK=str(r - node_of.index(node)), LOCAL_WORLD_SIZE=str(here))
            env = _ranks.environment(place, base=env0)
            cmd = [sys.executable, "-m", WORKER, config_path]
            if cluster is not None:
                env.update(cluster.rank_env(node))
                cmd = cluster.exec_prefix(node) + cmd
            procs.spawn(cmd, env)
        _wait(procs, timeout_s, servers)
        servers.expect_exit(SERVER_EXIT_S)
    finally:
        procs.stop()
        servers.stop()
        if config_path is not None:
            os.unlink(config_path)


def _wait(procs: _ranks.RankProcs, timeout_s: float, servers: Optional[Servers] = None) -> None:
    """Raise LaunchError unless every rank exits 0 within ``timeout_s``; kill
    the rest FAILURE_GRACE_S after one fails, or at once when a reduction
    server fails (the ranks would wait for it up to their group timeout)."""
    def done():
        return all(c is not None for c in procs.exitcodes()) or bool(servers and servers.failed())

    why = procs.wait(time.monotonic() + timeout_s, done=done, failure_grace_s=FAILURE_GRACE_S)
    if servers and servers.failed() and procs.running():
        alive = procs.running()
        procs.stop()
        raise LaunchError(f"reduction server process(es) exited with status {servers.failed()} before the job "
                          f"ended (see their output above); ranks {alive} killed")
    if why is not None:
        alive = procs.running()
        procs.stop()
        why = f"did not finish within {timeout_s:g} s" if why == "deadline" else \
            "still running after another rank failed"
        raise LaunchError(f"ranks {alive} {why}; killed (exit codes {procs.exitcodes()})")
    bad = {r: c for r, c in enumerate(procs.exitcodes()) if c != 0}
    if bad:
        raise LaunchError(f"ranks failed with exit codes {bad}")


def run_mpirun(config: dict, nodes: int, ranks_per_node: int, timeout_s: float) -> None:
    """Run the job under OpenMPI's mpirun (all ranks on this machine); the
    worker then also times MPI_Allreduce in the same processes."""
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
    procs = _ranks.RankProcs()
    procs.spawn(cmd, env)
    try:
        _wait(procs, timeout_s)
    except LaunchError as e:
        raise LaunchError(f"mpirun: {e}") from None
    finally:
        procs.stop()
        os.unlink(config_path)


# ---------------------------------------------------------------- a rank's start

class Ranks:
    """This process's place in the job and its groups."""

    def __init__(self, config: dict):
        self.mpi_comm = None
        env = os.environ
        if "OMPI_COMM_WORLD_RANK" in env or "PMIX_RANK" in env or config.get("mpi"):
            self._from_mpi(config)
        self.rank = int(env["RANK"])
        self.world = int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.device = torch.device(config.get("device", "cpu"))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        torch.set_num_threads(int(config.get("threads", 1)))

        # Every group's timeout (benches that make groups of their own use it too).
        self.timeout = timeout = datetime.timedelta(seconds=float(config.get("pg_timeout_s", 300)))
        dist.init_process_group("fairring", init_method="env://", timeout=timeout)
        self.fairring = dist.group.WORLD
        # Measurement plumbing (barriers, gathering times) never shares a
        # group with a backend under test.
        self.control = dist.new_group(backend="gloo", timeout=timeout)
        self.baseline_name = "nccl" if self.device.type == "cuda" else "gloo"
        self.baseline = dist.new_group(backend=self.baseline_name, timeout=timeout)
        # Compressed rails (--wire-dtype): one more fairring group per wire dtype.
        self.wire_groups = []
        for w in config.get("wire_dtypes") or []:
            g = dist.new_group(backend="fairring", timeout=timeout, pg_options=fairring_py.Options(wire_dtype=w))
            self.wire_groups.append((w, g))
        # Reduction servers (--servers M): the plain group and each wire
        # dtype's again, their all-reduces between nodes through the servers
        # (None: the plain group's wire dtype).
        self.server_groups = []
        m = int(config.get("servers") or 0)
        if m:
            for w in [None] + list(config.get("wire_dtypes") or []):
                g = dist.new_group(backend="fairring", timeout=timeout,
                                   pg_options=fairring_py.Options(wire_dtype=w, reduction_servers=m))
                self.server_groups.append((w, g))

    def _from_mpi(self, config: dict) -> None:
        try:
            from mpi4py import MPI  # optional: only --mpi needs it
        except ImportError:
            raise SystemExit("fairring bench: --mpi needs mpi4py (python3 -m pip install mpi4py)") from None
        comm = MPI.COMM_WORLD
        env = os.environ
        env["RANK"], env["WORLD_SIZE"] = str(comm.Get_rank()), str(comm.Get_size())
        env["LOCAL_RANK"] = env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in env:  # started by a user's own mpirun
            env["MASTER_PORT"] = str(comm.bcast(free_port() if comm.Get_rank() == 0 else None, root=0))
        k = config.get("simulate_ranks_per_node")
        if k:  # simulated nodes: mpirun cannot give each rank its own variable
            env["FAIRRING_NODE_ID"] = str(comm.Get_rank() // int(k))
        self.mpi_comm = comm.Dup()

    def max_over_ranks(self, values: List[float]) -> List[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return t.tolist()

    def sum_floats_over_ranks(self, values: List[float]) -> List[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.control)
        return t.tolist()

    def sum_over_ranks(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, group=self.control)
        return int(t.item())

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def run_job(cfg: dict, rank_main, nodes: int, ranks_per_node: int, timeout_s: float, use_netns: bool,
            link_rate: Optional[float], prog: str) -> int:
    """The end of a training job's main(): this process is one rank under
    torchrun, or it launches the ranks here (in network namespaces with
    `use_netns`, links capped at `link_rate` bytes/s)."""
    if external_launcher() == "torchrun":
        cfg.update(nodes=None, ranks_per_node=None)
        return run_rank(cfg, rank_main)
    exit_on_signals()
    try:
        if use_netns:
            netns.check_usable(link_rate=bool(link_rate))
            with netns.Cluster(nodes, link_rate, servers=int(cfg.get("servers") or 0)) as cluster:
                run_ranks(cfg, nodes, ranks_per_node, timeout_s, cluster=cluster)
        else:
            run_ranks(cfg, nodes, ranks_per_node, timeout_s)
    except (LaunchError, netns.NetnsError) as e:
        print(f"fairring {prog}: {e}", file=sys.stderr)
        return 1
    return 0


def run_rank(cfg: dict, job: Callable[[Ranks, dict], int]) -> int:
    """Run ``job(ranks, cfg)`` as this rank: join the groups, print any failure
    to stderr, leave the groups.  Returns the rank's exit code."""
    try:
        code = job(Ranks(cfg), cfg)
    except SystemExit as e:
        print(e, file=sys.stderr, flush=True)
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        rank = os.environ.get("RANK", "?")
        print(f"rank {rank}: benchmark failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        code = 1
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    return code


# ---------------------------------------------------------------- run metadata

def fairring_topology() -> str:
    try:
        pg = dist.distributed_c10d._get_default_group()
        t = pg._get_backend(torch.device("cpu")).topology()
        if t.get("uneven"):
            return "+".join(str(len(n)) for n in t["node_ranks"])
        return f"{t['num_nodes']}x{t['ranks_per_node']}"
    except Exception as e:  # informational only
        return f"unknown ({e})"


def git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=5)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return r.stdout.strip() + ("+dirty" if dirty else "") if r.returncode == 0 else ""
    except Exception:
        return ""


def run_meta(ranks: Ranks, cfg: dict, **job) -> dict:
    """The "meta" of a report: when, which code, where, the job's shape (then
    ``job``, the fields of that job).  The launcher is recorded when the
    config names one (the microbenchmark's does)."""
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "host": os.uname().nodename,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "device": ranks.device.type,
        "world_size": ranks.world,
        "nodes": cfg.get("nodes"),
        "ranks_per_node": cfg.get("ranks_per_node"),
        "fairring_topology": fairring_topology(),
    }
    if cfg.get("node_sizes"):
        meta["node_sizes"] = cfg["node_sizes"]
    if "launcher" in cfg:
        meta["launcher"] = cfg["launcher"]
    meta.update(netns=cfg.get("netns", False), link_rate_Bps=cfg.get("link_rate_Bps"))
    meta.update(job)
    return meta


def publish(summary: dict, table: str, out, filename: str) -> None:
    """Rank 0's report of a training job: the table on stdout and, with an
    output directory, the summary as ``out/filename``."""
    print(table, flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, filename)
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"wrote {path}", file=sys.stderr, flush=True)


def steps_heading(m: dict) -> str:
    """The tail of a training report's first line (the links, in namespaces)
    and its second line (what a step's time means)."""
    links = f", netns links {m['link_rate_Bps'] * 8 / 1e9:g} Gbit/s" if m.get("link_rate_Bps") else ""
    return (links + "\n" + f"{m['steps']} timed steps after {m['warmup']} warm-up; "
            "step time = slowest rank's, median (p10-p90)")

