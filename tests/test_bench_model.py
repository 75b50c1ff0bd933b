"""The all-reduce's cost model (fairring_py/bench/model.py): its terms for
each schedule, a fit that recovers known costs from points made with them,
the bench results it reads and skips, and the extrapolation's rows."""
from __future__ import annotations

import json
import math

import pytest

from fairring_py.bench import metrics, model

GBIT = 1e9 / 8
TRUE = model.Params(alpha_s=80e-6, o_s=6e-6, k0_s=150e-6, k_byte_s=1.5e-9, k_msg_s=20e-6)


def _point(nodes, size, schedule="direct", rate=GBIT, cores=2, q=TRUE):
    p = model.Point(nodes=nodes, size=size, link_Bps=rate, schedule=schedule, slice_bytes=1 << 20,
                    shared_cores=cores)
    cpu = model.cpu_per_rank(p, q)
    return model.Point(**{**p.__dict__, "measured_s": model.predict(p, q), "cpu_per_rank_s": cpu})


def test_terms_of_each_schedule():
    q = model.Params(alpha_s=1e-4, o_s=1e-5, k0_s=0.0, k_byte_s=0.0, k_msg_s=0.0, payload=1.0)
    s = 8 << 20
    direct = model.terms(model.Point(16, s, GBIT, "direct", slice_bytes=1 << 20), q)
    assert direct["link"] == pytest.approx(2 * 15 / 16 * s / GBIT)
    assert direct["latency"] == pytest.approx(2 * (1e-4 + 15 * 1e-5))
    assert model.messages(model.Point(16, s, GBIT, "direct", slice_bytes=1 << 20)) == 2 * 15 * 8
    servers = model.terms(model.Point(16, s, GBIT, "servers"), q)
    assert servers["link"] == pytest.approx(s / GBIT)  # S each way on every link: 1.875x less than 2(N-1)/N S
    ring = model.terms(model.Point(16, s, GBIT, "ring"), q)
    assert ring["latency"] == pytest.approx(30 * (1e-4 + 1e-5)) and ring["link"] == direct["link"]
    hd = model.terms(model.Point(16, s, GBIT, "halving_doubling"), q)
    assert hd["latency"] == pytest.approx(8 * (1e-4 + 1e-5))
    assert model.messages(model.Point(1000, s, GBIT, "halving_doubling")) == 20
    # Levels as shipped: the direct exchange below 16 nodes and for chunks of
    # shards above N KiB (1 MiB slices: 64 KiB shards at 16 nodes, 32 KiB at 32).
    assert model.terms(model.Point(15, s, GBIT, "levels"), q) == model.terms(model.Point(15, s, GBIT, "direct"), q)
    assert model.terms(model.Point(16, s, GBIT, "levels"), q) == direct
    lv = model.terms(model.Point(32, s, GBIT, "levels", slice_bytes=1 << 20), q)
    assert lv["latency"] == pytest.approx(4 * (1e-4 + 5 * 1e-5))
    assert model.messages(model.Point(32, s, GBIT, "levels", slice_bytes=1 << 20)) == 2 * (7 + 3) * 8
    lv16 = model.Point(16, 256 << 10, GBIT, "levels", slice_bytes=1 << 20)  # 16 KiB shards: [8, 2]
    assert model.rounds(lv16) == (4, 4) and model.messages(lv16) == 2 * (7 + 1)
    # On the simulated cluster the ranks share the cores: 16 ranks of 1 ms each on 2 cores take 8 ms.
    q2 = model.Params(alpha_s=0, o_s=0, k0_s=1e-3, k_byte_s=0, k_msg_s=0)
    assert model.terms(model.Point(16, 4, GBIT, "ring", shared_cores=2), q2)["cpu"] == pytest.approx(8e-3)
    assert model.terms(model.Point(16, 4, GBIT, "ring"), q2)["cpu"] == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="unknown schedule"):
        model.messages(model.Point(4, 4, GBIT, "tree"))


def test_the_fit_recovers_the_costs_it_was_made_with():
    sizes = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    train = [_point(n, s) for n in (2, 4, 16) for s in sizes] + [_point(n, s, rate=GBIT / 10) for n in (2, 16)
                                                                 for s in sizes]
    q = model.fit(train)
    assert q.k0_s == pytest.approx(TRUE.k0_s, rel=1e-6)
    assert q.k_byte_s == pytest.approx(TRUE.k_byte_s, rel=1e-6)
    assert q.k_msg_s == pytest.approx(TRUE.k_msg_s, rel=1e-6)
    # Held out: 8 nodes, which the fit never saw, within 2%.
    for s in sizes:
        p = _point(8, s)
        assert model.predict(p, q) == pytest.approx(p.measured_s, rel=0.02), (s, q)


def test_the_cpu_fit_keeps_costs_at_zero_or_more():
    # CPU that only grows with bytes: no negative per-op or per-message cost makes up for noise.
    pts = [model.Point(4, s, GBIT, "direct", measured_s=1.0, cpu_per_rank_s=2e-9 * s * f)
           for s, f in ((1 << 20, 1.05), (4 << 20, 0.97), (16 << 20, 1.0), (64 << 20, 1.01))]
    q = model.fit_cpu(pts, model.Params())
    assert q.k0_s >= 0 and q.k_msg_s >= 0 and q.k_byte_s == pytest.approx(2e-9, rel=0.05)


def _results(tmp_path, name, nodes, backend_rows, rpn=1, rate=GBIT, env=None, coll="all_reduce"):
    d = tmp_path / name
    d.mkdir()
    meta = {"collective": coll, "ranks_per_node": rpn, "link_rate_Bps": rate, "nodes": nodes, "cpus": 2,
            "fairring_env": env or {"FAIRRING_SOCKET_IFNAME": "fbr0"}}
    rows = [{"backend": b, "size_bytes": s, "median_s": t, "cpu_ranks_per_op_s": c} for b, s, t, c in backend_rows]
    (d / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}))


def test_load_points_takes_one_rank_per_node_all_reduces_with_capped_links(tmp_path):
    rows = [("fairring", 4096, 1e-3, 4e-3), ("gloo", 4096, 2e-3, 6e-3), ("fairring+srv", 4096, 1e-3, None),
            ("fairring-bf16", 4096, 1e-3, 1e-3)]
    _results(tmp_path, "ok", 4, rows)
    _results(tmp_path, "two_per_node", 4, rows, rpn=2)
    _results(tmp_path, "loopback", 4, rows, rate=None)
    _results(tmp_path, "tuned", 4, rows, env={"FAIRRING_SLICE_SIZE": "65536"})
    _results(tmp_path, "other_collective", 4, rows, coll="all_gather")
    pts = model.load_points([str(tmp_path)], slice_of=lambda n, k: 1 << 20)
    assert sorted((p.schedule, p.source) for p in pts) == [
        ("direct", "ok/results.json"), ("ring", "ok/results.json"), ("servers", "ok/results.json")]
    direct = next(p for p in pts if p.schedule == "direct")
    assert direct.cpu_per_rank_s == pytest.approx(1e-3) and direct.shared_cores == 2
    assert next(p for p in pts if p.schedule == "servers").cpu_per_rank_s is None


def test_check_holds_points_out_and_extrapolation_rows_are_complete():
    sizes = [4 << 10, 1 << 20, 16 << 20]
    pts = [_point(n, s) for n in (2, 4, 8, 16) for s in sizes] + [_point(8, s, "servers") for s in sizes] + \
        [_point(n, s, "ring", q=model.Params(alpha_s=3e-4, o_s=0, k0_s=1e-4, k_byte_s=3e-9, k_msg_s=0))
         for n in (2, 4, 8, 16) for s in sizes]
    res = model.check(pts, hold_nodes=(8,))
    held = [r for r in res["points"] if r["held_out"]]
    assert {(r["point"].nodes, r["point"].schedule) for r in held} == {(8, "direct"), (8, "servers"), (8, "ring")}
    assert all(abs(r["error"]) < 0.02 for r in res["points"] if r["fit"] == "fairring"), res["points"]
    rows = model.extrapolate(res["params"]["fairring"], nodes=(64, 1024), gbits=(100,), sizes=(1 << 20,),
                             slice_of=lambda n, k: 4 << 20)
    assert [(r["nodes"], r["gbit"]) for r in rows] == [(64, 100), (1024, 100)]
    for r in rows:
        # No schedule beats its own link bound (the servers' is 2(N-1)/N smaller).
        for sched in ("direct", "ring", "halving_doubling"):
            assert r[sched] >= r["bound"]
        assert r["servers"] >= r["bound"] * r["nodes"] / (2 * (r["nodes"] - 1))
    text = model.format_report(res, rows)
    assert "held-out points: 9" in text and "| 100 Gbit/s | 1024 | 1 MiB |" in text
    assert not math.isnan(res["params"]["fairring"].alpha_s)


def test_bench_model_says_when_nothing_fits(tmp_path, capsys):
    assert model.main([str(tmp_path)], str(tmp_path / "out")) == 2
    assert "no all-reduce results of one rank per node" in capsys.readouterr().out
    assert metrics.tcp_payload_fraction() == model.Params().payload
