"""Anchors (issue 25): Fairring's 1-node CPU all-reduce next to the strongest CPU
collective libraries on this machine: Intel oneCCL, DeepSpeed's shared-memory
all-reduce, OpenMPI, gloo.

    python3 benchmarks/anchors.py                                   # everything, 2 ranks, 2 rounds
    python3 benchmarks/anchors.py --libs fairring,oneccl --rounds 1 --sizes 4K,25M
    python3 benchmarks/anchors.py --oneccl-find-links /tmp/ccl --deepspeed /tmp/ds/deepspeed-0.19.8.tar.gz

What it installs, all under --scratch (default /tmp/fairring-anchors), never
into the system's site-packages:
  oneccl/     `pip install --prefix` of the wheels oneccl-cpu, oneccl-cpu-devel
              (headers) and impi-rt (Intel MPI: mpiexec/hydra, libmpi), --no-deps.
              oneccl-cpu 2022.2's libccl.so.1 needs libccl.so.2, which only the
              `oneccl` wheel (the GPU build) ships: that wheel is downloaded and
              that one file taken from it.  No libfabric is needed on one node
              (Intel MPI runs over its shared memory there and never loads it).
              Then benchmarks/anchors/oneccl_allreduce.cpp is compiled with g++.
  ds-venv/    a virtual environment with --system-site-packages (so it uses the
              installed torch) with DeepSpeed (DS_BUILD_OPS=0, no build
              isolation); its shared-memory op is built just in time into
              torch-extensions/.
OpenMPI (mpirun + mpi4py), gloo and Fairring are used as installed (Fairring
from this source tree, PYTHONPATH = the project root).  A library that cannot
be installed or started is skipped with the reason printed; the others run.

How each is timed: benchmarks/anchors/allreduce_worker.py (fairring, gloo,
deepspeed, mpi) and oneccl_allreduce.cpp run the same loop, the method of
`python -m fairring_py.bench`: float32 SUM in place, per size a warm-up, then
samples of a barrier and R back-to-back blocking all-reduces (R so that a
sample lasts about --sample-ms), time per op = the slowest rank's time / R,
median over samples (about --time-per-size seconds; at most 3x that under load), every result compared
exactly.  Each library runs alone, one after another (the order rotates from
round to round); the table gives, per size, the median over --rounds of each
round's median.  Worker threads off where a library has them: oneCCL
CCL_WORKER_COUNT=1 (with one core per rank it then runs without a worker
thread); DeepSpeed's OpenMP reduction loops and every torch rank
OMP_NUM_THREADS=1 / one torch thread.  Pinning is each launcher's default:
Intel MPI's mpiexec pins rank i to core i, OpenMPI's mpirun binds each rank to
a core (none when oversubscribed), torchrun pins nothing.

Output: a markdown table of microseconds per op, one column per library (the
fastest of each row in bold) and Fairring / fastest other, and one of each
library's CPU time per op (the process's CPU time, all its threads, over the
timed samples, divided by their ops; the rank with most), printed and written
to --out (anchors.md, anchors.json).  The 4-byte row is each library's floor;
torch's own share of a call (dist.all_reduce on torch's fake process group, a
backend that moves nothing) is measured and printed beside it.  Exit status 1
if any result was wrong, 0 otherwise (skips included).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "anchors", "allreduce_worker.py")
ONECCL_SRC = os.path.join(HERE, "anchors", "oneccl_allreduce.cpp")
LIBS = ["fairring", "gloo", "mpi", "oneccl", "deepspeed"]
TITLES = {"fairring": "Fairring", "gloo": "gloo", "mpi": "OpenMPI", "oneccl": "oneCCL", "deepspeed": "DeepSpeed shm"}
FLOOR_SIZE = 4  # bytes: each library's floor row
KiB, MiB = 1024, 1024 * 1024


def log(msg: str) -> None:
    print(f"[anchors {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KiB, "M": MiB, "G": 1024 * MiB}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if t[-1:] in "KMG" else t) * scale
    except ValueError:
        n = -1
    if n <= 0 or n != int(n) or int(n) % 4:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: a positive multiple of 4 bytes (4K, 1M, 25M, ...)")
    return int(n)


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(cmd, env=None, timeout=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, timeout=timeout, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def tail(text: str, n: int = 12) -> str:
    return "\n".join("    " + line for line in (text or "").strip().splitlines()[-n:])


class Skip(Exception):
    """A library that cannot be installed or run here: the reason is printed, the others go on."""


def base_env() -> dict:
    env = dict(os.environ)
    # The project root first: Fairring from this tree, and torch's autoload entry point
    # (_fairring_autoload, possibly stale in the system's site-packages) resolvable.
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------- setup, one per library

def pip(python: str, args: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return sh([python, "-m", "pip", "--disable-pip-version-check", *args], env=env, timeout=timeout)


def setup_torch_lib(lib: str, a) -> dict:
    env = base_env()
    code = "import torch, torch.distributed as dist; print(torch.__version__)"
    if lib == "fairring":
        code = "import torch, fairring_py; print(torch.__version__, getattr(fairring_py, '__version__', '?'))"
    r = sh([sys.executable, "-c", code], env=env, timeout=120)
    if r.returncode:
        raise Skip(f"{lib}: cannot import it with PYTHONPATH={ROOT} (is the extension built in place? "
                   f"python3 -m pip install --no-build-isolation -e .):\n{tail(r.stdout)}")
    return {"version": r.stdout.strip().splitlines()[-1],
            "settings": "torchrun (unpinned), one torch thread, OMP_NUM_THREADS=1"
                        + (", Fairring's defaults (FAIRRING_* as in the environment)" if lib == "fairring" else "")}


def setup_mpi(a) -> dict:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("mpi: no mpirun on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev; then "
                   "python3 -m pip install mpi4py)")
    r = sh([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"],
           env=base_env(), timeout=60)
    if r.returncode:
        raise Skip(f"mpi: mpi4py does not import (python3 -m pip install mpi4py):\n{tail(r.stdout)}")
    version = r.stdout.strip().replace("\x00", "")
    if "Open MPI" not in version:
        log(f"mpi: mpi4py is built against {version!r}, not OpenMPI; timing it anyway")
    return {"version": version, "mpirun": mpirun,
            "settings": "mpirun's default binding (a core per rank; none when oversubscribed), mpi4py"}


def setup_oneccl(a) -> dict:
    prefix = os.path.join(a.scratch, "oneccl")
    wheels = os.path.join(a.scratch, "wheels")
    env = base_env()
    find = ["--find-links", a.oneccl_find_links] if a.oneccl_find_links else []
    specs = [f"oneccl-cpu=={a.oneccl_version}", f"oneccl-cpu-devel=={a.oneccl_version}", a.impi_spec]
    marker = os.path.join(prefix, "anchors-installed.json")
    want = {"specs": specs}
    have = json.load(open(marker)) if os.path.exists(marker) else None
    if have != want:
        shutil.rmtree(prefix, ignore_errors=True)
        log(f"oneccl: pip install --prefix {prefix} {' '.join(specs)}")
        r = pip(sys.executable, ["install", "--no-deps", "--no-warn-script-location", "--root-user-action=ignore",
                                 "--prefix", prefix, *find, *specs], env, a.install_timeout)
        if r.returncode:
            raise Skip(f"oneccl: pip could not install {' '.join(specs)}:\n{tail(r.stdout)}")
        libdir = os.path.join(prefix, "lib")
        if not os.path.exists(os.path.join(libdir, "libccl.so.2")):
            # oneccl-cpu's libccl.so.1 has NEEDED libccl.so.2 (and takes Intel's fast memcpy from it),
            # which the oneccl-cpu wheel lacks: the GPU build's wheel `oneccl` of the same version has it.
            os.makedirs(wheels, exist_ok=True)
            log(f"oneccl: libccl.so.2 is missing from oneccl-cpu; taking it from the oneccl=={a.oneccl_version} wheel")
            r = pip(sys.executable, ["download", "--no-deps", "-d", wheels, *find, f"oneccl=={a.oneccl_version}"],
                    env, a.install_timeout)
            whl = [f for f in os.listdir(wheels) if f.startswith(f"oneccl-{a.oneccl_version}-") and f.endswith(".whl")]
            if r.returncode or not whl:
                raise Skip(f"oneccl: libccl.so.2 (needed by oneccl-cpu's libccl.so.1) not found; pip download "
                           f"oneccl=={a.oneccl_version} failed:\n{tail(r.stdout)}")
            with zipfile.ZipFile(os.path.join(wheels, whl[0])) as z:
                member = next((m for m in z.namelist() if m.endswith("/data/lib/libccl.so.2")), None)
                if member is None:
                    raise Skip(f"oneccl: {whl[0]} has no lib/libccl.so.2")
                with z.open(member) as src, open(os.path.join(libdir, "libccl.so.2"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
        with open(marker, "w") as f:
            json.dump(want, f)
    for need in ("include/oneapi/ccl.hpp", "lib/libccl.so", "lib/libccl.so.2", "bin/mpiexec"):
        if not os.path.exists(os.path.join(prefix, need)):
            raise Skip(f"oneccl: {need} is missing under {prefix} after the install")
    gxx = shutil.which("g++")
    if gxx is None:
        raise Skip("oneccl: no g++ to compile benchmarks/anchors/oneccl_allreduce.cpp (apt-get install g++)")
    exe = os.path.join(a.scratch, "oneccl_allreduce")
    cmd = [gxx, "-O2", "-std=c++17", ONECCL_SRC, "-I", os.path.join(prefix, "include"), "-L",
           os.path.join(prefix, "lib"), "-lccl", f"-Wl,-rpath,{os.path.join(prefix, 'lib')}", "-o", exe]
    r = sh(cmd, timeout=300)
    if r.returncode:
        raise Skip(f"oneccl: g++ failed: {' '.join(cmd)}\n{tail(r.stdout)}")
    impi = sorted(glob.glob(os.path.join(prefix, "lib", "python*", "site-packages", "impi_rt-*.dist-info")))
    impi = os.path.basename(impi[-1])[len("impi_rt-"):-len(".dist-info")] if impi else "?"
    return {"prefix": prefix, "exe": exe, "impi_rt": impi, "specs": specs,
            "settings": f"C++ API, CCL_WORKER_COUNT=1 (no worker thread), CCL_ATL_TRANSPORT=mpi over Intel MPI {impi} "
                        f"(impi-rt; shared memory, no libfabric), mpiexec's default pinning (rank i on core i)"}


def setup_deepspeed(a) -> dict:
    venv = os.path.join(a.scratch, "ds-venv")
    py = os.path.join(venv, "bin", "python")
    env = base_env()
    env["DS_BUILD_OPS"] = "0"
    env["DS_ACCELERATOR"] = "cpu"
    env["TORCH_EXTENSIONS_DIR"] = os.path.join(a.scratch, "torch-extensions")
    probe = "import deepspeed; print(deepspeed.__version__)"
    r = sh([py, "-c", probe], env=env, timeout=120) if os.path.exists(py) else None
    if r is None or r.returncode:
        if not os.path.exists(py):
            # --without-pip: the venv runs the system's pip and setuptools (visible through
            # --system-site-packages); a venv-seeded old setuptools cannot build with a new wheel.
            r = sh([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], timeout=300)
            if r.returncode:
                raise Skip(f"deepspeed: python -m venv failed:\n{tail(r.stdout)}")
        log(f"deepspeed: pip install {a.deepspeed} into {venv} (DS_BUILD_OPS=0)")
        r = pip(py, ["install", "--no-build-isolation", "--root-user-action=ignore", a.deepspeed], env,
                a.install_timeout)
        if r.returncode:
            raise Skip(f"deepspeed: pip install {a.deepspeed} failed:\n{tail(r.stdout)}")
        r = sh([py, "-c", probe], env=env, timeout=120)
        if r.returncode:
            raise Skip(f"deepspeed: installed but does not import:\n{tail(r.stdout)}")
    version = r.stdout.strip().splitlines()[-1]
    log("deepspeed: building its shared-memory op just in time (once; cached in torch-extensions/)")
    build = ("from deepspeed.accelerator import get_accelerator\n"
             "import deepspeed.ops\n"
             "b = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
             "assert b is not None and deepspeed.ops.__compatible_ops__.get(b.NAME), 'ShareMemCommBuilder: not compatible'\n"
             "m = b.load()\n"
             "print('kernel level', m.vector_kernel_level())\n")
    t0 = time.monotonic()
    try:
        r = sh([py, "-c", build], env=env, timeout=a.install_timeout)
    except subprocess.TimeoutExpired:
        raise Skip(f"deepspeed: the JIT build of its shared-memory op took over {a.install_timeout:.0f} s") from None
    if r.returncode:
        raise Skip(f"deepspeed: the JIT build of its shared-memory op failed:\n{tail(r.stdout, 25)}")
    return {"version": version, "python": py, "jit_build_s": round(time.monotonic() - t0, 1),
            "kernel": r.stdout.strip().splitlines()[-1],
            "settings": "DS_ACCELERATOR=cpu, LOCAL_SIZE=ranks (its shm path), OMP_NUM_THREADS=1, gloo process group, "
                        "torchrun (unpinned)"}


# ---------------------------------------------------------------- torch's own floor

FLOOR_CODE = """
import statistics, time, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
torch.set_num_threads(1)
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
x = torch.ones(1024)
for _ in range(2000):
    dist.all_reduce(x)
rounds = []
for _ in range(7):
    t0 = time.perf_counter()
    for _ in range(20000):
        dist.all_reduce(x)
    rounds.append((time.perf_counter() - t0) / 20000)
print(statistics.median(rounds) * 1e6)
"""


def torch_floor_us():
    """What a blocking dist.all_reduce of 4 KiB costs in torch alone: the same
    call on torch's fake process group (its backend returns a completed Work
    and moves nothing; torch.testing's FakeStore), one process, median of 7
    rounds of 20,000 calls.  None if it cannot run."""
    try:
        r = sh([sys.executable, "-c", FLOOR_CODE], env=base_env(), timeout=300)
        return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None


# ---------------------------------------------------------------- running

def worker_args(a, sizes) -> list:
    return ["--sizes", ",".join(map(str, sizes)), "--time-per-size", str(a.time_per_size),
            "--sample-ms", str(a.sample_ms)]


def launch(lib: str, info: dict, a, sizes) -> tuple:
    """The command and environment that run one sweep of ``lib`` on a.ranks ranks."""
    env = base_env()
    n = str(a.ranks)
    if lib in ("fairring", "gloo", "deepspeed"):
        py = info["python"] if lib == "deepspeed" else sys.executable
        if lib == "deepspeed":
            env.update(DS_ACCELERATOR="cpu", LOCAL_SIZE=n,
                       TORCH_EXTENSIONS_DIR=os.path.join(a.scratch, "torch-extensions"))
        cmd = [py, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", WORKER, "--lib", lib, *worker_args(a, sizes)]
    elif lib == "mpi":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        over = ["--oversubscribe"] if a.ranks > (os.cpu_count() or 1) else []
        cmd = [info["mpirun"], "-np", n, *over, "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", sys.executable, WORKER,
               "--lib", "mpi", *worker_args(a, sizes)]
    else:  # oneccl
        prefix = info["prefix"]
        kvs = os.path.join(a.scratch, f"oneccl-kvs-{os.getpid()}")
        if os.path.exists(kvs):
            os.unlink(kvs)
        env.update(CCL_WORKER_COUNT="1", CCL_ATL_TRANSPORT="mpi", I_MPI_ROOT=prefix,
                   PATH=os.path.join(prefix, "bin") + os.pathsep + env.get("PATH", ""),
                   LD_LIBRARY_PATH=os.pathsep.join(p for p in [os.path.join(prefix, "lib"),
                                                               env.get("LD_LIBRARY_PATH", "")] if p))
        cmd = [os.path.join(prefix, "bin", "mpiexec"), "-n", n, info["exe"], *worker_args(a, sizes),
               "--kvs-file", kvs]
    return cmd, env


def run_once(lib: str, info: dict, a, sizes) -> dict:
    """One sweep: {size: result dict}, plus the library's own header line under 'meta'."""
    cmd, env = launch(lib, info, a, sizes)
    timeout = 120 + 10 * a.time_per_size * len(sizes) * max(1, a.ranks // 2)
    t0 = time.monotonic()
    try:
        r = sh(cmd, env=env, timeout=timeout, cwd=a.scratch)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"failed": f"timed out after {timeout:.0f} s:\n{tail(out)}", "results": {}, "meta": {}}
    results, meta = {}, {}
    for line in r.stdout.splitlines():
        if line.startswith("{") and '"lib"' in line:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "size" in d:
                results[d["size"]] = d
            else:
                meta = d
    failed = ""
    if r.returncode and not any(d.get("error") for d in results.values()):
        failed = f"exit status {r.returncode}: {' '.join(cmd)}\n{tail(r.stdout, 20)}"
    elif len(results) < len(sizes) and not failed:
        failed = f"only {len(results)} of {len(sizes)} sizes reported:\n{tail(r.stdout, 20)}"
    return {"failed": failed, "results": results, "meta": meta, "wall_s": round(time.monotonic() - t0, 1)}


# ---------------------------------------------------------------- report

def machine() -> dict:
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "unknown"

    cpu = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    commit = sh(["git", "-C", ROOT, "describe", "--always", "--dirty"], timeout=30).stdout.strip()
    gxx = sh(["g++", "--version"], timeout=30).stdout.splitlines()[0] if shutil.which("g++") else "-"
    ext = sorted(glob.glob(os.path.join(ROOT, "fairring_py", "_C*.so")))
    built = (datetime.datetime.fromtimestamp(os.path.getmtime(ext[0])).astimezone().isoformat(timespec="seconds")
             if ext else "?")
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()], "fairring_extension_built": built,
            "host_cpus": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"), "python": platform.python_version(),
            "fairring_commit": commit, "gxx": gxx}


def table(summary: dict) -> str:
    libs = summary["libs"]
    rows = summary["rows"]
    head = ("| size | " + " | ".join(TITLES[x] for x in libs) + " | Fairring / fastest other |")
    lines = [head, "|---" * (len(libs) + 2) + "|"]
    for row in rows:
        us = row["us"]
        valid = {x: v for x, v in us.items() if v is not None}
        best = min(valid.values()) if valid else None
        cells = []
        for x in libs:
            v = us.get(x)
            if v is None:
                cells.append("-" if x not in row["errors"] else "WRONG")
                continue
            txt = f"{v:.1f}" if v < 1000 else f"{v:.0f}"
            if x in row["errors"]:
                txt += " (WRONG)"
            cells.append(f"**{txt}**" if v == best else txt)
        ratio = row.get("ratio")
        rtxt = f"{ratio:.2f} ({TITLES[row['fastest_other']]})" if ratio is not None else "-"
        label = fmt_size(row["size"]) + (" (floor)" if row["size"] == FLOOR_SIZE else "")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {rtxt} |")
    return "\n".join(lines)


def summarize(a, sizes, libs_ok, runs, infos, skipped, m, wall) -> dict:
    rows = []
    for size in sizes:
        us, errors, per_round, cpu = {}, {}, {}, {}
        for lib in libs_ok:
            meds = [run["results"][size]["median_s"] for run in runs[lib] if size in run["results"]]
            cpus = [run["results"][size]["cpu_s"] for run in runs[lib]
                    if size in run["results"] and run["results"][size].get("cpu_s") is not None]
            cpu[lib] = statistics.median(cpus) * 1e6 if cpus else None
            errs = [run["results"][size]["error"] for run in runs[lib]
                    if size in run["results"] and run["results"][size].get("error")]
            per_round[lib] = [x * 1e6 for x in meds]
            us[lib] = statistics.median(meds) * 1e6 if meds else None
            if errs:
                errors[lib] = errs[0]
        row = {"size": size, "us": us, "per_round_us": per_round, "errors": errors, "cpu_us": cpu}
        others = {x: v for x, v in us.items() if x != "fairring" and v is not None}
        if us.get("fairring") is not None and others:
            fastest = min(others, key=others.get)
            row.update(fastest_other=fastest, ratio=us["fairring"] / others[fastest])
        rows.append(row)
    floor = next((r["us"].get("fairring") for r in rows if r["size"] == FLOOR_SIZE), None)
    return {"libs": libs_ok, "rows": rows, "floor_us": floor, "skipped": skipped, "machine": m,
            "command": " ".join([os.path.relpath(sys.argv[0]) if os.path.exists(sys.argv[0]) else sys.argv[0]]
                                + sys.argv[1:]),
            "ranks": a.ranks, "rounds": a.rounds, "time_per_size_s": a.time_per_size, "sample_ms": a.sample_ms,
            "versions": {lib: dict(infos[lib], **{k: v for run in runs[lib] for k, v in run["meta"].items()
                                                  if k not in ("lib", "ranks")})
                         for lib in libs_ok},
            "failed_runs": {lib: [r["failed"] for r in runs[lib] if r["failed"]] for lib in libs_ok},
            "wall_s": round(wall, 1)}


def cpu_table(summary: dict) -> str:
    libs = summary["libs"]
    lines = ["| size | " + " | ".join(TITLES[x] for x in libs) + " |", "|---" * (len(libs) + 1) + "|"]
    for row in summary["rows"]:
        cells = []
        for x in libs:
            v = row.get("cpu_us", {}).get(x)
            cells.append("-" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}"))
        lines.append(f"| {fmt_size(row['size'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(s: dict) -> str:
    m = s["machine"]
    out = [f"All-reduce, float32 SUM, {s['ranks']} ranks on one node: microseconds per op (median of "
           f"{s['rounds']} round(s), each the median over samples of the slowest rank's time per op); "
           f"fastest per row in bold; Fairring / fastest other > 1 means Fairring is slower.", "",
           table(s), ""]
    out += ["CPU time per op: microseconds of CPU, all of a rank's threads (its process's CPU time over the "
            "timed samples / their ops), the rank with most, median of the rounds. With one rank per core, a "
            "library that waits by spinning shows about its wall time here.", "", cpu_table(s), ""]
    if s["floor_us"] is not None:
        out.append(f"Floor: Fairring's 4-byte all-reduce takes {s['floor_us']:.1f} us.")
    if s.get("torch_floor_us") is not None:
        out.append(f"Torch's own share: a blocking dist.all_reduce of 4 KiB on torch's fake process group (a "
                   f"backend that moves nothing) takes {s['torch_floor_us']:.1f} us, in every torch library's "
                   f"time above and in none of oneCCL's or OpenMPI's.")
    def gist(text):  # the first line and the last (pip's or the compiler's error)
        lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
        return lines[0] + (f" ... {lines[-1]}" if len(lines) > 1 else "")

    for lib, why in s["skipped"].items():
        out.append(f"Skipped {TITLES[lib]}: {gist(why)}")
    for lib, fails in s["failed_runs"].items():
        for f in fails:
            out.append(f"{TITLES[lib]}: a round failed: {gist(f)}")
    out += ["", f"Command: `{s['command']}`; {m['date']}; {m['host_cpus']} CPUs ({m['cpu']}), kernel "
            f"{m['kernel']}, transparent huge pages `{m['thp']}`; Fairring {m['fairring_commit']} (extension built "
            f"{m['fairring_extension_built']}); load average at the end {m['loadavg_1_5_15']}; Python "
            f"{m['python']}; {m['gxx']}; {s['wall_s']:.0f} s end to end.", ""]
    for lib, v in s["versions"].items():
        keep = {k: v[k] for k in ("version", "path", "jit_build_s") if k in v}
        out.append(f"- {TITLES[lib]}: " + ", ".join(f"{k} {val}" for k, val in keep.items())
                   + (f"; {v['settings']}" if v.get("settings") else ""))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 benchmarks/anchors.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--scratch", default="/tmp/fairring-anchors", help="where installs and builds go")
    p.add_argument("--ranks", type=int, default=2, help="ranks on this node (default 2)")
    p.add_argument("--sizes", default="4K,64K,256K,1M,4M,25M",
                   help="bytes per rank (default 4K,64K,256K,1M,4M,25M); a 4-byte floor row is always added")
    p.add_argument("--time-per-size", type=float, default=1.5, help="seconds of samples per size and library")
    p.add_argument("--sample-ms", type=float, default=10.0, help="target length of one sample (default 10 ms)")
    p.add_argument("--rounds", type=int, default=2, help="sweeps per library; the table takes their median")
    p.add_argument("--libs", default=",".join(LIBS), help=f"subset of {','.join(LIBS)}")
    p.add_argument("--out", default="anchors_out", help="directory for anchors.md and anchors.json")
    p.add_argument("--oneccl-version", default="2022.2.0")
    p.add_argument("--impi-spec", default="impi-rt==2021.19.0", help="the Intel MPI runtime wheel to install")
    p.add_argument("--oneccl-find-links", help="a folder of already downloaded wheels for pip (--find-links)")
    p.add_argument("--deepspeed", default="deepspeed==0.19.8", help="pip requirement or path of an sdist")
    p.add_argument("--install-timeout", type=float, default=900, help="seconds for each install or build step")
    a = p.parse_args(argv)
    try:
        given = {parse_size(x) for x in a.sizes.split(",") if x.strip()}
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if not given:
        p.error("--sizes is empty")
    sizes = sorted({FLOOR_SIZE} | given)
    libs = [x.strip() for x in a.libs.split(",") if x.strip()]
    if not libs or any(x not in LIBS for x in libs):
        p.error(f"--libs takes names from {','.join(LIBS)}")
    if a.ranks < 2 or a.rounds < 1 or a.time_per_size <= 0:
        p.error("--ranks must be >= 2, --rounds >= 1, --time-per-size > 0")
    a.scratch = os.path.abspath(a.scratch)
    os.makedirs(a.scratch, exist_ok=True)
    t_start = time.monotonic()

    setups = {"fairring": lambda: setup_torch_lib("fairring", a), "gloo": lambda: setup_torch_lib("gloo", a),
              "mpi": lambda: setup_mpi(a), "oneccl": lambda: setup_oneccl(a), "deepspeed": lambda: setup_deepspeed(a)}
    infos, skipped = {}, {}
    for lib in libs:
        t0 = time.monotonic()
        try:
            infos[lib] = setups[lib]()
            log(f"{lib}: ready ({time.monotonic() - t0:.0f} s)")
        except (Skip, subprocess.TimeoutExpired, OSError) as e:
            skipped[lib] = str(e)
            log(f"SKIPPING {lib}: {e}")
    ok = [x for x in libs if x in infos]
    runs = {lib: [] for lib in ok}
    for rnd in range(a.rounds):
        order = ok[rnd % len(ok):] + ok[:rnd % len(ok)] if ok else []
        for lib in order:
            log(f"round {rnd + 1}/{a.rounds}: {lib}")
            run = run_once(lib, infos[lib], a, sizes)
            runs[lib].append(run)
            if run["failed"]:
                log(f"{lib}: round {rnd + 1} failed: {run['failed']}")
            for size, d in sorted(run["results"].items()):
                flag = f"  WRONG RESULT: {d['error']}" if d.get("error") else ""
                log(f"  {lib:9s} {fmt_size(size):>8s}: {d['median_s'] * 1e6:10.1f} us  "
                    f"(R {d['reps']}, {d['samples']} samples){flag}")
    log("torch's own floor (fake process group)")
    floor = torch_floor_us()
    summary = summarize(a, sizes, ok, runs, infos, skipped, machine(), time.monotonic() - t_start)
    summary["torch_floor_us"] = floor
    md = markdown(summary)
    print(md, flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "anchors.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "anchors.json"), "w") as f:
        json.dump(dict(summary, raw={lib: runs[lib] for lib in ok}), f, indent=1, default=str)
    log(f"wrote {os.path.join(a.out, 'anchors.md')} and anchors.json ({summary['wall_s']:.0f} s in all)")
    wrong = [(lib, r["size"], r["errors"][lib]) for r in summary["rows"] for lib in r["errors"]]
    if wrong:
        print("\n!!!!!!!! CHECK FAILED: wrong all-reduce results !!!!!!!!", file=sys.stderr)
        for lib, size, err in wrong:
            print(f"!!! {lib} at {fmt_size(size)}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
