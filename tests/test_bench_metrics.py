"""Pure helpers of the benchmarks (fairring_py/bench/metrics.py) and the
argument checks of their command lines."""
from __future__ import annotations

import math
import sys

import pytest

from fairring_py.bench import metrics
from fairring_py.bench import __main__ as bench_cli
from fairring_py.bench import ddp as ddp_cli
from fairring_py.bench import launch, netns

KiB, MiB = 1024, 1024 * 1024


@pytest.mark.parametrize("text,n", [("4096", 4096), ("4K", 4 * KiB), ("4k", 4 * KiB), ("25M", 25 * MiB),
                                    ("25MiB", 25 * MiB), ("1G", 1024 * MiB), ("0.5M", MiB // 2), (" 8KB ", 8 * KiB)])
def test_parse_size(text, n):
    assert metrics.parse_size(text) == n


@pytest.mark.parametrize("text", ["", "4X", "-4K", "0", "K", "1.3", "4 K B", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="bad size"):
        metrics.parse_size(text)


def test_parse_sizes_lists_and_ranges():
    assert metrics.parse_sizes("25M,4K,4K") == [4 * KiB, 25 * MiB]
    assert metrics.parse_sizes("4K:32K") == [4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB]
    assert metrics.parse_sizes("4K:256M:4") == metrics.DEFAULT_SIZES
    assert metrics.DEFAULT_SIZES[0] == 4 * KiB and metrics.DEFAULT_SIZES[-1] == 256 * MiB
    assert metrics.parse_sizes("4K:10K,1M") == [4 * KiB, 8 * KiB, MiB]


@pytest.mark.parametrize("text,msg", [("8K:4K", "LO is larger"), ("4K:8K:1", "FACTOR"), ("4K:8K:x", "FACTOR"),
                                      ("1:2:3:4", "bad size range"), ("6", "multiple of the element size"),
                                      ("", "empty"), ("4K,,8Q", "bad size")])
def test_parse_sizes_rejects(text, msg):
    with pytest.raises(ValueError, match=msg):
        metrics.parse_sizes(text)


def test_parse_rate():
    assert metrics.parse_rate("1gbit") == 125e6
    assert metrics.parse_rate("500Mbit") == 62.5e6
    assert metrics.parse_rate("8bit") == 1
    for bad in ("1g", "fast", "0gbit", "1 gbyte"):
        with pytest.raises(ValueError, match="link rate"):
            metrics.parse_rate(bad)


def test_parse_int_list():
    assert metrics.parse_int_list("2,3,4", "--scaling", lo=2) == [2, 3, 4]
    for bad in ("1,2", "2,x", ""):
        with pytest.raises(ValueError, match="--scaling"):
            metrics.parse_int_list(bad, "--scaling", lo=2)


def test_fmt_size():
    assert metrics.fmt_size(4 * KiB) == "4 KiB"
    assert metrics.fmt_size(25 * MiB) == "25 MiB"
    assert metrics.fmt_size(16793600) == "16.0 MiB"
    assert metrics.fmt_size(1000) == "1000 B"


def test_bandwidths_follow_nccl_tests():
    assert metrics.algbw(1e9, 0.5) == 2e9
    assert metrics.busbw_factor(2) == 1.0
    assert metrics.busbw_factor(4) == 1.5
    assert metrics.busbw_factor(1) == 0.0
    assert metrics.busbw(1e9, 1.0, 8) == pytest.approx(1.75e9)
    assert math.isnan(metrics.algbw(1, 0))


def test_link_bound():
    # 2 nodes: each sends and receives the whole tensor once.
    assert metrics.link_bound_s(125e6, 2, 125e6) == pytest.approx(1.0)
    # 4 nodes, 25 MiB at 1 Gbit/s: 1.5 x 26214400 / 125e6
    assert metrics.link_bound_s(25 * MiB, 4, 125e6) == pytest.approx(0.3145728)
    assert metrics.link_bound_s(25 * MiB, 1, 125e6) == 0.0


def test_tcp_payload_fraction():
    assert metrics.tcp_payload_fraction() == pytest.approx(1448 / 1514)
    assert metrics.tcp_payload_fraction(9000) > 0.99


def test_percentile_and_summary():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert metrics.percentile(xs, 50) == 3.0
    assert metrics.percentile(xs, 0) == 1.0 and metrics.percentile(xs, 100) == 5.0
    assert metrics.percentile([1.0, 2.0], 50) == 1.5
    assert metrics.percentile(list(range(11)), 10) == pytest.approx(1.0)
    s = metrics.summarize(xs)
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.0, 1.0, 5.0, 5)
    assert math.isnan(metrics.percentile([], 50))


def test_choose_reps_and_samples():
    # 1 ms ops, 20 ms samples -> 20 reps; capped by max_reps and by buffer memory
    assert metrics.choose_reps(1e-3, 20e-3, 1000, 4 * KiB, 64 * MiB) == 20
    assert metrics.choose_reps(1e-6, 20e-3, 1000, 4 * KiB, 64 * MiB) == 1000
    assert metrics.choose_reps(1e-6, 20e-3, 1000, 1 * MiB, 64 * MiB) == 64
    assert metrics.choose_reps(1.0, 20e-3, 1000, 256 * MiB, 64 * MiB) == 1
    assert metrics.choose_samples(0.1, 2.0, 5, 30) == 20
    assert metrics.choose_samples(1.0, 2.0, 5, 30) == 5
    assert metrics.choose_samples(1e-4, 2.0, 5, 30) == 30


@pytest.mark.parametrize("argv,msg", [
    (["--sizes", "4X"], "bad size"),
    (["--link-rate", "1gbit"], "needs --netns"),
    (["--netns", "--link-rate", "fast"], "link rate"),
    (["--mpi", "--netns"], "cannot be combined"),
    (["--scaling", "1,2"], "--scaling"),
    (["--nodes", "0"], "--nodes"),
])
def test_cli_rejects_bad_input(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bench_cli.main(argv)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


def test_ddp_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit):
        ddp_cli.main(["--link-rate", "1gbit"])
    assert "needs --netns" in capsys.readouterr().err


def test_netns_needs_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsError, match="needs root"):
        netns.check_usable()


def test_netns_names_and_tbf():
    c = netns.Cluster(3, 125e6, pid=4242)
    assert c.node_ns == ["fairring-bench-4242-n0", "fairring-bench-4242-n1", "fairring-bench-4242-n2"]
    assert c.address(0) == "198.18.0.1" and c.address(2) == "198.18.0.3"
    assert netns.ours(["x", "fairring-bench-4242-sw", "fairring-bench-77-n0"], pid=4242) == ["fairring-bench-4242-sw"]
    args = netns.tbf_args(125e6)
    assert args[:3] == ["tbf", "rate", "1000000000bit"] and int(args[4]) == 125000


def test_external_launcher_detection():
    assert launch.external_launcher({}) is None
    assert launch.external_launcher({"RANK": "0", "WORLD_SIZE": "2"}) == "torchrun"
    assert launch.external_launcher({"OMPI_COMM_WORLD_RANK": "0"}) == "mpi"
    env = launch.rank_env(5, 6, 2, "10.0.0.1", 1234)
    assert env["FAIRRING_NODE_ID"] == "2" and env["LOCAL_RANK"] == "1" and env["RANK"] == "5"


def test_mpi_without_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(launch.LaunchError, match="--mpi needs (mpi4py|OpenMPI's mpirun)"):
        launch.run_mpirun({"job": "allreduce"}, 1, 2, timeout_s=5)


def test_busbw_factor_per_collective():
    # nccl-tests: reduce_scatter and all_gather (P-1)/P of the full buffer, broadcast 1;
    # all_to_all, gather and scatter (P-1)/P (all but one block crosses)
    for c in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
        assert metrics.busbw_factor(2, c) == 0.5
        assert metrics.busbw_factor(4, c) == 0.75
        assert metrics.busbw_factor(1, c) == 0.0
        assert metrics.busbw(1e9, 1.0, 8, c) == pytest.approx(0.875e9)
    assert metrics.busbw_factor(4, "broadcast") == 1.0
    assert metrics.busbw_factor(4, "all_reduce") == metrics.busbw_factor(4) == 1.5
    with pytest.raises(ValueError):
        metrics.busbw_factor(4, "all_to_allv")


def test_link_bound_all_to_all_gather_scatter():
    # all_to_all: each node's K ranks send (N-1)/N of their input off the node
    assert metrics.link_bound_s(25 * MiB, 2, 125e6, "all_to_all", 2) == pytest.approx(2 * 0.5 * 25 * MiB / 125e6)
    assert metrics.link_bound_s(25 * MiB, 4, 125e6, "all_to_all", 1) == pytest.approx(0.75 * 25 * MiB / 125e6)
    # gather / scatter of a root list of S: (N-1)/N of it crosses the root's node's link
    for c in ("gather", "scatter"):
        assert metrics.link_bound_s(25 * MiB, 4, 125e6, c) == pytest.approx(0.75 * 25 * MiB / 125e6)
    assert metrics.link_bound_s(25 * MiB, 1, 125e6, "all_to_all", 2) == 0.0


def test_link_bound_reduce_scatter_all_gather():
    # each node sends (reduce_scatter) or receives (all_gather) (N-1)/N of the full buffer once
    assert metrics.link_bound_s(125e6, 2, 125e6, "reduce_scatter") == pytest.approx(0.5)
    assert metrics.link_bound_s(25 * MiB, 4, 125e6, "all_gather") == pytest.approx(0.75 * 25 * MiB / 125e6)
    assert metrics.link_bound_s(25 * MiB, 1, 125e6, "all_gather") == 0.0
    # every other node receives all of a broadcast
    assert metrics.link_bound_s(125e6, 2, 125e6, "broadcast") == pytest.approx(1.0)
    assert metrics.link_bound_s(125e6, 4, 125e6, "broadcast") == pytest.approx(1.0)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_cli_accepts_reduce_scatter_all_gather(collective):
    p = bench_cli.parser()
    args = p.parse_args(["--collective", collective, "--sizes", "4K,1M", "--inflight", "2"])
    cfg = bench_cli.build_config(args, p)
    assert cfg["collective"] == collective and cfg["job"] == "allreduce" and cfg["sizes"] == [4 * KiB, MiB]


def test_workloads_of_reduce_scatter_and_all_gather():
    """Sizes are the full buffer (input of reduce_scatter, output of all_gather),
    rounded down to 4 x P bytes; outputs reset to NaN; expectations computed
    without any collective."""
    import torch

    from fairring_py.bench import worker

    cpu = torch.device("cpu")
    world = 3
    rs = [worker.Workload("reduce_scatter", r, world, 4096, cpu) for r in range(world)]
    assert rs[0].size == 4092 and rs[0].inp.numel() == 1023 and rs[0].out_numel == 341
    total = sum(w.inp for w in rs)
    for r, w in enumerate(rs):
        assert torch.equal(w.expected, total[r * 341:(r + 1) * 341])
    ag = [worker.Workload("all_gather", r, world, 4096, cpu) for r in range(world)]
    assert ag[1].size == 4092 and ag[1].inp.numel() == 341 and ag[1].out_numel == 1023
    assert torch.equal(ag[1].expected, torch.cat([w.inp for w in ag]))
    buf = ag[0].buffers(1)[0]
    ag[0].reset(buf)
    assert torch.isnan(buf).all() and worker.check([buf], ag[0].expected, "x", 0)
    assert ag[0].check_input(0) == ""
    ag[0].inp[5] += 1
    assert "input was modified" in ag[0].check_input(0)
    ar = worker.Workload("all_reduce", 0, world, 4096, cpu)
    assert ar.size == 4096 and ar.in_place
    with pytest.raises(SystemExit, match="too small"):
        worker.Workload("all_gather", 0, 4, 8, cpu)


def test_fsdp_cli():
    from fairring_py.bench import fsdp as fsdp_cli

    assert fsdp_cli.parse_variants("2,1") == ["fsdp2", "fsdp1"]
    assert fsdp_cli.parse_variants("fsdp1") == ["fsdp1"]
    with pytest.raises(ValueError, match="--fsdp"):
        fsdp_cli.parse_variants("3")
    with pytest.raises(SystemExit):
        fsdp_cli.main(["--link-rate", "1gbit"])


@pytest.mark.parametrize("collective,api", [("reduce_scatter", "reduce_scatter_single"),
                                            ("all_gather", "all_gather_single")])
def test_report_of_reduce_scatter_all_gather(collective, api):
    """The report's busbw and link bound follow the collective: (P-1)/P and (N-1)/N
    of the full buffer."""
    from fairring_py.bench import report

    meta = {"world_size": 4, "nodes": 2, "ranks_per_node": 2, "link_rate_Bps": 125e6, "inflight": 1,
            "collective": collective, "api": api, "dtype": "float32", "op": "SUM", "device": "cpu",
            "fairring_topology": "2x2", "netns": True}
    memcpy = {"bytes": 64 * MiB, "alone_Bps": 1e10, "concurrent_per_rank_Bps": 5e9}
    results = [{"size": MiB, "reps": [1, 1], "samples": 2, "times": [[0.01, 0.01], [0.02, 0.02]], "error": "",
                "checked": 4}]
    s = report.summarize_run(meta, memcpy, ["fairring", "gloo"], results)
    f, g = s["rows"]
    assert f["algbw_GBps"] == pytest.approx(MiB / 0.01 / 1e9)
    assert f["busbw_GBps"] == pytest.approx(0.75 * f["algbw_GBps"])
    assert f["link_bound_s"] == pytest.approx(0.5 * MiB / 125e6) and g["speedup_vs_baseline"] == 1.0
    text = report.table(s)
    assert text.startswith(api) and "busbw = algbw x (P-1)/P" in text and "link bound = (N-1)/N" in text
