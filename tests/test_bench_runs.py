"""The benchmarks run end to end on tiny workloads: the microbenchmark (local,
torchrun, mpirun, network namespaces), its cleanup after failures, and the DDP
benchmark.  Each run is a subprocess with a deadline."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import launch as test_launch
from fairring_py.bench import netns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 150
# Tiny and quick: two sizes, few samples.
QUICK = ["--sizes", "4K,96K", "--time-per-size", "0.2", "--min-samples", "2", "--max-samples", "3",
         "--sample-ms", "2", "--no-progress"]


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRRING_")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _run(args, timeout=DEADLINE_S, module="fairring_py.bench", prefix=()):
    cmd = list(prefix) + [sys.executable, "-m", module] + list(args)
    try:
        return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} did not finish within {timeout}s\n{e.stdout}\n{e.stderr}")


def _check_outputs(out_dir, backends, world, sizes):
    with open(os.path.join(out_dir, "results.json")) as f:
        res = json.load(f)
    assert res["check"]["ok"] and res["check"]["results_checked_per_rank"] > 0
    assert res["backends"] == backends and res["meta"]["world_size"] == world
    rows = res["rows"]
    assert [(r["size_bytes"], r["backend"]) for r in rows] == [(s, b) for s in sizes for b in backends]
    for r in rows:
        assert 0 < r["p10_s"] <= r["median_s"] <= r["p90_s"], r
        assert r["busbw_GBps"] > 0 and r["samples"] >= 2
    base = [r for r in rows if r["backend"] == backends[1]]
    assert all(r["speedup_vs_baseline"] == 1.0 for r in base)
    assert res["memcpy"]["concurrent_per_rank_Bps"] > 0
    with open(os.path.join(out_dir, "results.csv")) as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(rows) and float(csv_rows[0]["median_s"]) == pytest.approx(rows[0]["median_s"])
    return res


def _check_plot(proc, path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plot skipped: matplotlib is not installed" in proc.stderr
        return
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("nodes,k,inflight", [(1, 2, 1), (2, 1, 3)])
def test_bench_local(tmp_path, nodes, k, inflight):
    out = str(tmp_path / "out")
    p = _run(["--nodes", str(nodes), "--ranks-per-node", str(k), "--inflight", str(inflight), "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = _check_outputs(out, ["fairring", "gloo"], 2, [4096, 96 * 1024])
    assert res["meta"]["fairring_topology"] == f"{nodes}x{k}" and res["meta"]["inflight"] == inflight
    _check_plot(p, os.path.join(out, "busbw.png"))
    assert "check: OK" in p.stdout and "busbw GB/s" in p.stdout
    assert ("3 all-reduces in flight" in p.stdout) == (inflight == 3)


def test_bench_broadcast(tmp_path):
    """`--collective broadcast`: every rank's buffer checked against rank 0's data;
    busbw is algbw (nccl-tests' convention for broadcast)."""
    out = str(tmp_path / "out")
    p = _run(["--collective", "broadcast", "--nodes", "2", "--ranks-per-node", "1", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = _check_outputs(out, ["fairring", "gloo"], 2, [4096, 96 * 1024])
    assert res["meta"]["collective"] == "broadcast"
    for r in res["rows"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
    assert p.stdout.startswith("broadcast float32 from rank 0") and "check: OK" in p.stdout


def test_bench_reduce(tmp_path):
    """`--collective reduce`: SUM to rank 0, the root's buffer checked (c10d
    promises nothing of the others'), busbw = algbw."""
    out = str(tmp_path / "r")
    p = _run(["--collective", "reduce", "--nodes", "2", "--ranks-per-node", "2", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["meta"]["collective"] == "reduce" and res["check"]["failed_ranks"] == 0
    for r in res["rows"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
    assert p.stdout.startswith("reduce float32 SUM to rank 0") and "check: OK" in p.stdout


@pytest.mark.parametrize("collective,nodes,k,inflight", [("reduce_scatter", 2, 1, 2), ("all_gather", 1, 2, 1)])
def test_bench_reduce_scatter_all_gather(tmp_path, collective, nodes, k, inflight):
    """`--collective reduce_scatter|all_gather`: sizes are each rank's full buffer,
    results checked exactly, busbw = algbw x (P-1)/P (nccl-tests)."""
    out = str(tmp_path / "out")
    p = _run(["--collective", collective, "--nodes", str(nodes), "--ranks-per-node", str(k),
              "--inflight", str(inflight), "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = _check_outputs(out, ["fairring", "gloo"], 2, [4096, 96 * 1024])
    assert res["meta"]["collective"] == collective and res["meta"]["inflight"] == inflight
    for r in res["rows"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 2)
    api = res["meta"]["api"]
    assert api in {"reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
                   "all_gather": ("all_gather_single", "all_gather_into_tensor")}[collective]
    assert p.stdout.startswith(f"{api} float32") and "check: OK" in p.stdout
    assert "deprecated" not in p.stderr
    assert ("2 reduce-scatters in flight" in p.stdout) == (inflight == 2)


@pytest.mark.parametrize("collective,size", [("all_gather", 40 << 20), ("reduce_scatter", 8 << 20)])
def test_bench_fresh_buffers(tmp_path, collective, size):
    """`--fresh-buffers`: a new output every op, results still checked; the
    report says so, gives the THP mode and the page faults per op, and times
    the same fairring group on reused outputs beside it (fairring-warm)."""
    runs = {}
    for fresh in (True, False):
        out = str(tmp_path / f"out{fresh}")
        p = _run(["--collective", collective, "--nodes", "1", "--ranks-per-node", "2", "--out", out,
                  "--sizes", str(size), "--time-per-size", "0.3", "--min-samples", "2", "--max-samples", "3",
                  "--sample-ms", "2", "--no-progress"] + (["--fresh-buffers"] if fresh else []))
        assert p.returncode == 0, p.stdout + p.stderr
        res = _check_outputs(out, ["fairring", "gloo"] + (["fairring-warm"] if fresh else []), 2, [size])
        assert res["meta"]["fresh_buffers"] is fresh and res["meta"]["thp"]
        assert ("a new torch.empty output for every op" in p.stdout) is fresh and "faults/op" in p.stdout
        runs[fresh] = {r["backend"]: r["faults_per_op"] for r in res["rows"]}
    out_pages = (size if collective == "all_gather" else size // 2) // 4096
    # Reused, Fairring's output faults in nothing: in a run of its own, and
    # as the warm twin in the fresh run.
    assert runs[False]["fairring"] < out_pages * 0.1, runs
    assert runs[True]["fairring-warm"] < out_pages * 0.1, runs
    if collective == "all_gather":
        # 40 MiB is above glibc's largest mmap threshold (32 MiB): each new output is
        # fresh memory, and gloo (never advised) faults once per 4 KiB page;
        # Fairring's advised output far less where huge pages can be advised.
        assert runs[True]["gloo"] >= out_pages * 0.9, runs
        if res["meta"]["thp"] == "madvise":
            assert runs[True]["fairring"] < out_pages * 0.25, runs


def test_bench_fresh_buffers_needs_a_tensor():
    p = _run(["--collective", "barrier", "--fresh-buffers", "--nodes", "1"])
    assert p.returncode != 0 and "--fresh-buffers applies to the collectives with a tensor" in p.stderr


@pytest.mark.parametrize("collective", ["all_reduce", "send_recv"])
def test_bench_fresh_buffers_in_place_and_send_recv(tmp_path, collective):
    """--fresh-buffers for the in-place collectives (the input written into a
    new tensor each op) and send/recv (received into new tensors): checked
    results, and the warm twin beside them."""
    out = str(tmp_path / "out")
    p = _run(["--collective", collective, "--nodes", "1", "--ranks-per-node", "2", "--out", out, "--sizes", "1M",
              "--time-per-size", "0.2", "--min-samples", "2", "--max-samples", "2", "--sample-ms", "2",
              "--no-progress", "--fresh-buffers"])
    assert p.returncode == 0, p.stdout + p.stderr
    res = _check_outputs(out, ["fairring", "gloo", "fairring-warm"], 2, [1 << 20])
    assert res["meta"]["fresh_buffers"] is True and "check: OK" in p.stdout


def test_bench_under_torchrun(tmp_path):
    out = str(tmp_path / "out")
    port = test_launch.free_port()
    p = _run(["--nproc_per_node=2", "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={port}",
              "-m", "fairring_py.bench", "--ranks-per-node", "1", "--out", out] + QUICK,
             module="torch.distributed.run")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res = _check_outputs(out, ["fairring", "gloo"], 2, [4096, 96 * 1024])
    assert res["meta"]["launcher"] == "torchrun" and res["meta"]["fairring_topology"] == "2x1"


def test_bench_mpi(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (OpenMPI baseline is optional)")
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed")
    out = str(tmp_path / "out")
    p = _run(["--mpi", "--nodes", "1", "--ranks-per-node", "2", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    _check_outputs(out, ["fairring", "gloo", "mpi"], 2, [4096, 96 * 1024])


def _namespaces():
    return set(netns.ours(netns.list_namespaces()))


def _host_links():
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n")


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                reason="network namespaces need root and iproute2 (ip, tc)")


def test_bench_with_reduction_servers(tmp_path):
    """--servers: each Fairring group also timed with a reduction server
    (fairring+srv), which really reduces (its exit report), checked like the rest."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "3", "--ranks-per-node", "1", "--servers", "1", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    assert res["backends"] == ["fairring", "gloo", "fairring+srv"] and res["check"]["ok"], res["backends"]
    assert res["meta"]["servers"] == 1 and res["servers"]
    assert os.path.exists(os.path.join(out, "servers.csv"))
    assert re.search(r"fairring server 0: exiting: .* served [1-9]\d* reductions", p.stderr), p.stderr


@needs_root
def test_bench_netns_link_bound(tmp_path):
    before, links = _namespaces(), _host_links()
    out = str(tmp_path / "out")
    p = _run(["--netns", "--link-rate", "1gbit", "--nodes", "2", "--ranks-per-node", "1", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = _check_outputs(out, ["fairring", "gloo"], 2, [4096, 96 * 1024])
    assert res["meta"]["link_rate_Bps"] == 125e6 and res["meta"]["fairring_topology"] == "2x1"
    for r in res["rows"]:
        # (sizes this small fit in tbf's bucket, so they may beat the bound)
        assert r["link_bound_s"] == pytest.approx(r["size_bytes"] / 125e6)
        assert r["bound_over_time"] > 0
    assert "bound/time" in p.stdout
    assert _namespaces() == before and _host_links() == links


@needs_root
def test_bench_scaling(tmp_path):
    before = _namespaces()
    out = str(tmp_path / "out")
    p = _run(["--netns", "--link-rate", "1gbit", "--scaling", "2,3", "--ranks-per-node", "1", "--out", out]
             + QUICK[2:] + ["--sizes", "96K"])
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "scaling.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["nodes"], r["backend"]) for r in rows] == [("2", "fairring"), ("2", "gloo"), ("3", "fairring"),
                                                         ("3", "gloo")]
    # the bound per byte grows as 2(N-1)/N
    assert float(rows[2]["bound_ns_per_byte"]) / float(rows[0]["bound_ns_per_byte"]) == pytest.approx(4 / 3)
    assert all(float(r["ns_per_byte"]) > 0 for r in rows)
    _check_plot(p, os.path.join(out, "scaling.png"))
    assert _namespaces() == before


@needs_root
def test_bench_netns_cleans_up_after_timeout(tmp_path):
    before, links = _namespaces(), _host_links()
    p = _run(["--netns", "--nodes", "2", "--ranks-per-node", "1", "--timeout", "0.5", "--out", str(tmp_path)] + QUICK)
    assert p.returncode == 1 and "did not finish within" in p.stderr, p.stdout + p.stderr
    assert _namespaces() == before and _host_links() == links


@needs_root
def test_bench_netns_cleans_up_after_sigterm(tmp_path):
    before = _namespaces()
    cmd = [sys.executable, "-m", "fairring_py.bench", "--netns", "--nodes", "2", "--ranks-per-node", "1",
           "--out", str(tmp_path)] + QUICK
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(_namespaces() - before) < 3:
        time.sleep(0.05)
    assert len(_namespaces() - before) == 3, "the namespaces never appeared"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert _namespaces() == before, out


@needs_root
def test_netns_cleanup_of_leftovers():
    dead_pid = 2**22 + 12345  # above pid_max's default: never a live process
    c = netns.Cluster(1, None, pid=dead_pid)
    c.create()
    assert c.switch in netns.list_namespaces()
    removed = netns.cleanup_leftovers()
    assert set(c.node_ns + [c.switch]) <= set(removed)
    assert not set(netns.ours(netns.list_namespaces(), pid=dead_pid))


def test_ddp_bench(tmp_path):
    out = str(tmp_path / "out")
    p = _run(["--nodes", "2", "--ranks-per-node", "1", "--width", "64", "--depth", "3", "--batch", "4",
              "--bucket-cap-mb", "0.01", "--steps", "2", "--warmup", "1", "--out", out], module="fairring_py.bench.ddp")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "ddp.json")) as f:
        res = json.load(f)
    assert res["check"]["ok"] and all(res["check"]["identical_across_ranks"].values())
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo"]
    assert all(r["samples_per_s"] > 0 for r in res["rows"])
    assert "check: OK" in p.stdout


def test_ddp_bench_with_reduction_servers(tmp_path):
    """--servers: a third replica over the fairring group with servers,
    bit-identical to the workers-only one (same sums, same order)."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "3", "--ranks-per-node", "1", "--width", "64", "--depth", "3", "--batch", "4",
              "--bucket-cap-mb", "0.01", "--steps", "2", "--warmup", "1", "--servers", "2", "--out", out],
             module="fairring_py.bench.ddp")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "ddp.json")) as f:
        res = json.load(f)
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo", "fairring+srv"]
    assert res["check"]["ok"] and all(res["check"]["identical_across_ranks"].values())
    assert res["rows"][2]["param_max_rel_diff_vs_fairring"] == 0.0
    assert re.search(r"served [1-9]\d* reductions", p.stderr), p.stderr


def test_fsdp_bench(tmp_path):
    """`python -m fairring_py.bench.fsdp`: FSDP2 and FSDP1 over fairring and gloo,
    samples/s per run, losses and parameter shards equal to 1e-5 relative."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "2", "--ranks-per-node", "1", "--width", "64", "--depth", "2", "--seq", "8", "--batch", "4",
              "--steps", "2", "--warmup", "1", "--out", out], module="fairring_py.bench.fsdp")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "fsdp.json")) as f:
        res = json.load(f)
    assert res["check"]["ok"] and res["meta"]["variants"] == ["fsdp2", "fsdp1"]
    # The third run of each variant is over torch's fake group (compute only).
    assert [(r["variant"], r["backend"]) for r in res["rows"]] == [
        (v, b) for v in ("fsdp2", "fsdp1") for b in ("fairring", "gloo", "compute only")]
    assert all(r["samples_per_s"] > 0 for r in res["rows"])
    for v in ("fsdp2", "fsdp1"):
        assert res["check"][v]["loss_max_rel_diff"] <= 1e-5 and res["fairring_kinds"][v]
        assert f"{v} communication per step (step minus compute only): fairring " in p.stdout
    assert "fsdp2 check: OK" in p.stdout and "fsdp1 check: OK" in p.stdout


@pytest.mark.parametrize("dropless", [False, True], ids=["capacity", "dropless"])
def test_moe_bench(tmp_path, dropless):
    """`python -m fairring_py.bench.moe`: an expert-parallel model whose layers
    send tokens with all_to_all_single (equal blocks of capacity slots, or
    with --dropless splits), over fairring, gloo and the fake group; losses
    equal, the all-to-alls native."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "2", "--ranks-per-node", "2", "--width", "32", "--hidden", "32", "--depth", "2", "--seq",
              "8", "--batch", "4", "--steps", "2", "--warmup", "1", "--out", out] + (["--dropless"] if dropless else []),
             module="fairring_py.bench.moe")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "moe.json")) as f:
        res = json.load(f)
    assert res["check"]["ok"] and res["check"]["loss_max_rel_diff"] <= 1e-5
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo", "compute only", "sync only"]
    assert all(r["tokens_per_s"] > 0 for r in res["rows"])
    # The sync-only run's all-to-alls move one element per rank (an int64
    # count with --dropless), its all-reduce one.
    assert 0 < res["sync_only_largest_op_bytes"] <= 8 * 4, res["sync_only_largest_op_bytes"]
    # Two all-to-alls per layer forward and two backward, every step; the
    # gate's gradients all-reduced once per step.
    kinds = res["fairring_kinds"]
    assert kinds.get("all_to_all", 0) >= 4 * 2 and kinds.get("all_reduce", 0) >= 1, kinds
    # Dropless: every splits all-to-all shares its sizes first.
    assert ("all_to_all_sizes" in kinds) == dropless, kinds
    assert res["meta"]["dropless"] == dropless
    assert not any("gloo" in k for k in kinds), kinds
    assert "communication per step (step minus compute only): fairring " in p.stdout and "check: OK" in p.stdout
    assert "sync only (every exchange moves one element): " in p.stdout and "waiting: " in p.stdout


def test_pipeline_bench(tmp_path):
    """`python -m fairring_py.bench.pipeline`: one stage per rank, 1F1B with
    isend/recv between neighbours, over fairring, gloo and the fake group;
    the last stage's losses equal, the sends and receives native."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "2", "--ranks-per-node", "2", "--width", "32", "--depth", "1", "--batch", "4",
              "--microbatches", "4", "--steps", "2", "--warmup", "1", "--out", out], module="fairring_py.bench.pipeline")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "pipeline.json")) as f:
        res = json.load(f)
    assert res["check"]["ok"] and res["check"]["loss_max_rel_diff"] <= 1e-5
    assert res["check"]["final_loss"]["fairring"] > 0
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo", "compute only", "sync only"]
    assert all(r["samples_per_s"] > 0 for r in res["rows"])
    assert res["sync_only_largest_op_bytes"] == 4, res["sync_only_largest_op_bytes"]  # one float per message
    kinds = res["fairring_kinds"]  # rank 0 (stage 0): sends activations, receives gradients
    assert kinds.get("send", 0) >= 4 and kinds.get("recv", 0) >= 4, kinds
    assert not any("gloo" in k for k in kinds), kinds
    assert "communication per step (step minus compute only): fairring " in p.stdout and "check: OK" in p.stdout
    assert "sync only (every exchange moves one element): " in p.stdout and "moving the bytes: fairring " in p.stdout


def test_pipeline_bench_without_extra_runs(tmp_path):
    """`--no-compute-only --no-sync-only`: only fairring and gloo, and neither
    line the extra runs feed."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "1", "--ranks-per-node", "2", "--width", "16", "--batch", "2", "--microbatches", "2",
              "--steps", "1", "--warmup", "0", "--no-compute-only", "--no-sync-only", "--out", out],
             module="fairring_py.bench.pipeline")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "pipeline.json")) as f:
        res = json.load(f)
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo"] and res["check"]["ok"]
    assert res["sync_only_largest_op_bytes"] is None
    assert "communication per step" not in p.stdout and "sync only" not in p.stdout


@pytest.mark.parametrize("collective", ["all_to_all", "gather", "scatter"])
def test_bench_all_to_all_gather_scatter(tmp_path, collective):
    """`--collective all_to_all|gather|scatter`: results checked exactly (the
    gather only on its root), busbw = algbw x (P-1)/P.  (2 nodes of 1: the
    rails; the collectives' 2 x 2 runs are test_all_to_all's and
    test_gather_scatter's.)"""
    out = str(tmp_path / "out")
    p = _run(["--collective", collective, "--nodes", "2", "--ranks-per-node", "1", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["meta"]["collective"] == collective and res["check"]["failed_ranks"] == 0
    for r in res["rows"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 1 / 2)
    assert p.stdout.startswith({"all_to_all": "all_to_all_single float32, equal blocks",
                                "gather": "gather float32 to rank 0",
                                "scatter": "scatter float32 from rank 0"}[collective]) and "check: OK" in p.stdout


def test_bench_send_recv(tmp_path):
    """`--collective send_recv`: a ping-pong between ranks 0 and 1 (rank 1's
    buffer checked exactly against rank 0's message), busbw = algbw x 2;
    --inflight is refused."""
    out = str(tmp_path / "out")
    p = _run(["--collective", "send_recv", "--nodes", "1", "--ranks-per-node", "3", "--out", out] + QUICK)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["meta"]["collective"] == "send_recv" and res["check"]["failed_ranks"] == 0
    for r in res["rows"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2)
    assert p.stdout.startswith("send/recv float32 ping-pong between ranks 0 and 1") and "check: OK" in p.stdout
    bad = _run(["--collective", "send_recv", "--inflight", "2", "--out", out] + QUICK)
    assert bad.returncode != 0 and "takes no --inflight" in bad.stderr


def test_fsdp_bench_without_compute_only(tmp_path):
    """`--no-compute-only` drops the run over torch's fake group and the line it feeds."""
    out = str(tmp_path / "out")
    p = _run(["--nodes", "1", "--ranks-per-node", "2", "--fsdp", "2", "--width", "64", "--depth", "1", "--seq", "4",
              "--batch", "2", "--steps", "1", "--warmup", "0", "--no-compute-only", "--out", out],
             module="fairring_py.bench.fsdp")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(out, "fsdp.json")) as f:
        res = json.load(f)
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo"] and res["check"]["ok"]
    assert "communication per step" not in p.stdout


def test_barrier_latency(tmp_path):
    """`--collective barrier`: one row per backend with its latency, the ratio to
    Fairring's, and the run's metadata; sizes are refused."""
    out = tmp_path / "out"
    p = _run(["--collective", "barrier", "--nodes", "1", "--ranks-per-node", "2", "--min-samples", "2",
              "--max-samples", "2", "--sample-ms", "2", "--out", str(out)])
    assert p.returncode == 0, p.stdout + p.stderr
    with open(out / "barrier.json") as f:
        res = json.load(f)
    assert [r["backend"] for r in res["rows"]] == ["fairring", "gloo"]
    for r in res["rows"]:
        assert 0 < r["p10_us"] <= r["median_us"] <= r["p90_us"] and r["samples"] == 2, r
    assert res["rows"][0]["fairring_speedup"] == 1.0
    assert res["meta"]["collective"] == "barrier" and res["meta"]["world_size"] == 2
    assert "| gloo |" in p.stdout
    bad = _run(["--collective", "barrier", "--sizes", "4K"])
    assert bad.returncode != 0 and "takes no --sizes" in bad.stderr
