"""A cost model of the all-reduce between nodes: Fairring's direct shard
exchange (every rank the reduction server of one shard), the same with
dedicated reduction servers, and the textbook ring and recursive
halving-doubling, on N nodes of one rank each.

    python -m fairring_py.bench --model DIR [DIR ...]    # DIRs of bench results (--netns runs)

A time is the larger of two throughputs plus a latency:

    T = max(T_link, T_cpu) + T_lat

  T_link  the bytes the busiest link carries each way over its payload rate
          (the link rate x TCP's payload share): 2(N-1)/N x S for the
          workers' schedules, S with N reduction servers (metrics.link_bound_s)
  T_cpu   a rank's CPU time per op, k0 + k_byte x S + k_msg x messages, where
          the messages are what the schedule sends per op (the direct
          exchange: 2(N-1) per slice, the slice as Fairring picks it; in
          levels, as Fairring ships them from 16 nodes for chunks whose
          shards are at most N KiB, 2 x sum(d - 1) per slice, the extra reduce
          passes left out; the
          ring 2(N-1) chunks; halving-doubling 2 log2 N); on the simulated
          cluster every rank shares the machine's cores (x ranks / cores), on
          a real one each rank has its own
  T_lat   the rounds the schedule waits through, each a latency alpha, and the
          messages a rank sends in a row before the last of a round leaves, o
          each: the direct exchange 2 rounds of N-1 messages, levels 2 per
          level of d - 1, the servers 2 of
          N, the ring 2(N-1) rounds of one, halving-doubling 2 log2 N of one
          (on the simulated cluster o x ranks / cores: the sending thread
          waits its turn for a core)

The CPU coefficients are fitted (least squares) to the CPU time the bench
measures per op; alpha and o to the measured times; the payload share is
TCP's (metrics.tcp_payload_fraction), not fitted.  Points are split: the
fit sees the training points only, and the report gives the error on the
held-out ones (another node count, another link rate, the servers).  Pure
logic: no I/O but load_points and the command line.
"""
from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional, Sequence

from fairring_py import _C

from . import metrics

SCHEDULES = ("direct", "levels", "servers", "ring", "halving_doubling")
# What each backend of the bench runs, for the points the model is checked on.
BACKEND_SCHEDULE = {"fairring": "direct", "fairring+srv": "servers", "gloo": "ring"}


@dataclass(frozen=True)
class Params:
    alpha_s: float = 50e-6    # per round
    o_s: float = 5e-6         # per message sent in a row within a round
    k0_s: float = 50e-6       # CPU per op
    k_byte_s: float = 1e-9    # CPU per byte of the rank's buffer
    k_msg_s: float = 10e-6    # CPU per message
    payload: float = metrics.tcp_payload_fraction()


@dataclass(frozen=True)
class Point:
    """One measured (or asked-for) all-reduce: N nodes of one rank, S bytes per rank."""
    nodes: int
    size: int
    link_Bps: float
    schedule: str
    slice_bytes: int = 1 << 20
    # The simulated cluster's machine: the cores every rank (and server) shares; 0: a real cluster.
    shared_cores: int = 0
    measured_s: Optional[float] = None
    cpu_per_rank_s: Optional[float] = None  # measured CPU per op of one rank
    source: str = ""


def levels(nodes: int) -> list:
    """The rail levels Fairring gives an all-reduce's large chunks on `nodes`
    nodes when FAIRRING_RAIL_RADIX is unset (the engine's rule,
    plan/rail_levels.h): [nodes] is the direct exchange."""
    return list(_C._rail_levels_for_test(nodes, _C._auto_rail_radix_for_test(nodes)))


def in_levels(p: Point) -> bool:
    """Whether Fairring sends this all-reduce's (first) chunk in levels: the
    engine's rule (chunk_in_levels) on the engine's plan of it."""
    if len(levels(p.nodes)) < 2:
        return False
    first = _C._plan_for_test(max(1, p.size // 4), 4, 1, p.nodes, p.slice_bytes)[0]
    return bool(_C._chunk_in_levels_for_test([tuple(s) for s in first["shards"][0]], p.nodes, 4))


def messages(p: Point) -> int:
    """What one rank sends per op (and receives)."""
    n = p.nodes
    if p.schedule == "levels" and not in_levels(p):
        p = replace(p, schedule="direct")
    if p.schedule == "direct":
        return 2 * (n - 1) * max(1, math.ceil(p.size / p.slice_bytes))
    if p.schedule == "levels":  # the direct exchange in each level's group (the extra reduce passes left out)
        return 2 * sum(d - 1 for d in levels(n)) * max(1, math.ceil(p.size / p.slice_bytes))
    if p.schedule == "servers":
        return 2 * n * max(1, math.ceil(p.size / p.slice_bytes))
    if p.schedule == "ring":
        return 2 * (n - 1)
    if p.schedule == "halving_doubling":
        return 2 * math.ceil(math.log2(n))
    raise ValueError(f"unknown schedule {p.schedule!r}")


def rounds(p: Point) -> tuple:
    """(rounds waited through, messages sent in a row per round) of one op's critical path."""
    n = p.nodes
    if p.schedule == "levels" and not in_levels(p):
        p = replace(p, schedule="direct")
    if p.schedule == "direct":
        return 2, n - 1
    if p.schedule == "levels":
        dims = levels(n)
        return 2 * len(dims), sum(d - 1 for d in dims) / len(dims)
    if p.schedule == "servers":
        return 2, n
    if p.schedule == "ring":
        return 2 * (n - 1), 1
    if p.schedule == "halving_doubling":
        return 2 * math.ceil(math.log2(n)), 1
    raise ValueError(f"unknown schedule {p.schedule!r}")


def cpu_per_rank(p: Point, q: Params) -> float:
    return q.k0_s + q.k_byte_s * p.size + q.k_msg_s * messages(p)


def link_time(p: Point, q: Params) -> float:
    servers = p.nodes if p.schedule == "servers" else 0
    return metrics.link_bound_s(p.size, p.nodes, p.link_Bps * q.payload, "all_reduce", 1, servers)


def terms(p: Point, q: Params) -> dict:
    """The model's terms for one point (seconds)."""
    cpu = cpu_per_rank(p, q)
    # On one machine every rank (and every server) takes its share of the cores.
    procs = p.nodes * (2 if p.schedule == "servers" else 1)
    t_cpu = cpu * procs / p.shared_cores if p.shared_cores else cpu
    r, in_a_row = rounds(p)
    # A rank's messages in a row are its thread's work: on the simulated
    # machine it waits its turn among the processes sharing the cores.
    share = max(1.0, procs / p.shared_cores) if p.shared_cores else 1.0
    t_lat = r * (q.alpha_s + in_a_row * q.o_s * share)
    t_link = link_time(p, q)
    return {"link": t_link, "cpu": t_cpu, "latency": t_lat, "total": max(t_link, t_cpu) + t_lat}


def predict(p: Point, q: Params) -> float:
    return terms(p, q)["total"]


# --------------------------------------------------------------------- fitting

def _solve(a: list, b: list) -> list:
    """Least squares for a few unknowns: the normal equations, Gauss-Jordan."""
    k = len(a[0])
    m = [[sum(row[i] * row[j] for row in a) for j in range(k)] + [sum(row[i] * y for row, y in zip(a, b))]
         for i in range(k)]
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(m[r][c]))
        if abs(m[piv][c]) < 1e-300:
            return [0.0] * k
        m[c], m[piv] = m[piv], m[c]
        for r in range(k):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][k] / m[i][i] for i in range(k)]


def fit_cpu(points: Sequence[Point], q: Params) -> Params:
    """k0, k_byte, k_msg from the points' measured CPU per rank (relative
    least squares: every point weighs alike, small or large), none below 0."""
    pts = [p for p in points if p.cpu_per_rank_s]
    if len(pts) < 3:
        return q
    cols = [lambda p: 1.0, lambda p: float(p.size), lambda p: float(messages(p))]
    active = [0, 1, 2]
    coef = [0.0, 0.0, 0.0]
    while active:
        rows = [[cols[i](p) / p.cpu_per_rank_s for i in active] for p in pts]
        sol = _solve(rows, [1.0] * len(pts))
        if all(x >= 0 for x in sol):
            coef = [0.0, 0.0, 0.0]
            for i, x in zip(active, sol):
                coef[i] = x
            break
        active.remove(active[min(range(len(sol)), key=lambda j: sol[j])])  # drop the most negative
    return replace(q, k0_s=coef[0], k_byte_s=coef[1], k_msg_s=coef[2])


def log_error(points: Sequence[Point], q: Params) -> float:
    return sum(math.log(predict(p, q) / p.measured_s) ** 2 for p in points)


def fit_latency(points: Sequence[Point], q: Params) -> Params:
    """alpha and o minimising the squared log error of the times: a grid,
    then a finer one around its best."""
    pts = [p for p in points if p.measured_s]
    if not pts:
        return q

    def grid(lo_a, hi_a, lo_o, hi_o, steps):
        best = None
        for i in range(steps + 1):
            a = lo_a * (hi_a / lo_a) ** (i / steps)
            for j in range(steps + 1):
                o = lo_o * (hi_o / lo_o) ** (j / steps)
                trial = replace(q, alpha_s=a, o_s=o)
                e = log_error(pts, trial)
                if best is None or e < best[0]:
                    best = (e, a, o)
        return best

    _, a, o = grid(1e-7, 1e-1, 1e-9, 1e-2, 40)
    _, a, o = grid(a / 3, a * 3, o / 3, o * 3, 30)
    return replace(q, alpha_s=a, o_s=o)


def fit(points: Sequence[Point], q: Params = Params()) -> Params:
    return fit_latency(points, fit_cpu(points, q))


# ----------------------------------------------------------------- the inputs

def auto_slice(nodes: int, ranks_per_node: int = 1) -> int:
    """The slice Fairring picks for a group that sets none (the backend's own rule)."""
    # The rule lives in the engine (common/config.h), which applies it.
    return int(_C._auto_slice_size_for_test(1 << 20, nodes * ranks_per_node, nodes))


def load_points(dirs: Iterable[str], slice_of: Callable[[int, int], int] = auto_slice) -> list:
    """Every all-reduce row of the bench results (results.json) under `dirs`
    with one rank per node, links capped and a schedule the model knows."""
    out = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "results.json"), recursive=True)):
            with open(path) as f:
                res = json.load(f)
            m = res["meta"]
            # Fairring as it ships: no setting that changes the schedule (the interface to use does not).
            tuned = set(m.get("fairring_env") or {}) - {"FAIRRING_SOCKET_IFNAME"}
            if m.get("collective", "all_reduce") != "all_reduce" or m.get("ranks_per_node") != 1 or \
                    not m.get("link_rate_Bps") or m.get("nodes", 0) < 2 or tuned:
                continue
            n = m["nodes"]
            for r in res["rows"]:
                sched = BACKEND_SCHEDULE.get(r["backend"])
                if sched is None or not r.get("median_s"):
                    continue
                if sched == "direct" and len(levels(n)) > 1 and m.get("rail_levels"):
                    sched = "levels"  # as shipped: in levels where its chunks are, direct elsewhere
                cpu = r.get("cpu_ranks_per_op_s")
                out.append(Point(nodes=n, size=r["size_bytes"], link_Bps=m["link_rate_Bps"], schedule=sched,
                                 slice_bytes=slice_of(n, 1), shared_cores=m.get("cpus") or 0,
                                 measured_s=r["median_s"], cpu_per_rank_s=cpu / n if cpu else None,
                                 source=os.path.relpath(path, d)))
    return out


def held_out(p: Point, hold_nodes: Sequence[int], hold_rates: Sequence[float]) -> bool:
    return p.nodes in hold_nodes or any(abs(p.link_Bps - r) < 1 for r in hold_rates) or p.schedule == "servers"


# ------------------------------------------------------------------- the report

def check(points: Sequence[Point], hold_nodes=(8,), hold_rates=()) -> dict:
    """Fits Fairring's schedule on its training points and gloo's ring on
    its own; returns both parameter sets and every point's prediction."""
    fairring = [p for p in points if p.schedule in ("direct", "levels", "servers")]
    gloo = [p for p in points if p.schedule == "ring"]
    out = {"params": {}, "points": []}
    for name, pts, train_sched in (("fairring", fairring, "direct"), ("gloo", gloo, "ring")):
        train = [p for p in pts if p.schedule == train_sched and not held_out(p, hold_nodes, hold_rates)]
        if not train:
            continue
        q = fit(train)
        out["params"][name] = q
        for p in pts:
            pred = predict(p, q)
            out["points"].append({"fit": name, "point": p, "predicted_s": pred, "terms": terms(p, q),
                                  "error": pred / p.measured_s - 1, "held_out": p not in train})
    return out


def extrapolate(q: Params, nodes=(64, 128, 256, 512, 1024), gbits=(25, 100, 400),
                sizes=(64 << 10, 1 << 20, 25 << 20, 256 << 20), slice_of: Callable[[int, int], int] = auto_slice) -> list:
    """Each schedule's time on a real cluster (one rank per node on its own
    cores) with the fitted per-message and per-byte costs."""
    rows = []
    for g in gbits:
        for n in nodes:
            for s in sizes:
                row = {"gbit": g, "nodes": n, "size": s}
                for sched in SCHEDULES:
                    p = Point(nodes=n, size=s, link_Bps=g * 1e9 / 8, schedule=sched, slice_bytes=slice_of(n, 1))
                    row[sched] = predict(p, q)
                row["bound"] = link_time(Point(nodes=n, size=s, link_Bps=g * 1e9 / 8, schedule="direct"), q)
                rows.append(row)
    return rows


def _rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    return f"{bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:g} Mbit/s"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}" if s < 1 else f"{s * 1e3:.0f}"


def format_report(result: dict, extra: list) -> str:
    lines = []
    for name, q in result["params"].items():
        lines.append(f"{name}: alpha {q.alpha_s * 1e6:.1f} us per round, o {q.o_s * 1e6:.2f} us per message in a "
                     f"row; CPU per op {q.k0_s * 1e6:.1f} us + {q.k_byte_s * 1e9:.3f} ns/byte + "
                     f"{q.k_msg_s * 1e6:.2f} us/message; payload share {q.payload:.3f}")
    lines.append("")
    lines.append("| fit | schedule | nodes | link | size | measured ms | model ms | error | held out | "
                 "link / cpu / latency ms |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(result["points"], key=lambda r: (r["fit"], r["point"].schedule, r["point"].link_Bps,
                                                    r["point"].nodes, r["point"].size)):
        p, t = r["point"], r["terms"]
        lines.append(f"| {r['fit']} | {p.schedule} | {p.nodes} | {_rate(p.link_Bps)} | "
                     f"{metrics.fmt_size(p.size)} | {_ms(p.measured_s)} | {_ms(r['predicted_s'])} | "
                     f"{r['error'] * 100:+.1f}% | {'yes' if r['held_out'] else ''} | "
                     f"{_ms(t['link'])} / {_ms(t['cpu'])} / {_ms(t['latency'])} |")
    held = [abs(r["error"]) for r in result["points"] if r["held_out"]]
    train = [abs(r["error"]) for r in result["points"] if not r["held_out"]]
    if held:
        worst = max(held)
        lines.append("")
        lines.append(f"held-out points: {len(held)}, median error {sorted(held)[len(held) // 2] * 100:.1f}%, "
                     f"worst {worst * 100:.1f}%, within 15%: {sum(e <= 0.15 for e in held)} of {len(held)}; "
                     f"training points: {len(train)}, median error "
                     f"{(sorted(train)[len(train) // 2] * 100) if train else float('nan'):.1f}%")
    if extra:
        lines.append("")
        lines.append("Extrapolated, one rank per node on its own cores, Fairring's fitted costs for every "
                     "schedule (ms; the fastest in bold):")
        lines.append("")
        lines.append("| link | nodes | size | direct | levels (as shipped) | servers | ring | halving-doubling | "
                     "link bound |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in extra:
            best = min(SCHEDULES, key=lambda s: r[s])
            cells = [(f"**{_ms(r[s])}**" if s == best else _ms(r[s])) for s in SCHEDULES]
            lines.append(f"| {r['gbit']} Gbit/s | {r['nodes']} | {metrics.fmt_size(r['size'])} | "
                         + " | ".join(cells) + f" | {_ms(r['bound'])} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, extra: list, path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for r in result["points"]:
        p = r["point"]
        ax1.scatter(p.measured_s * 1e3, r["predicted_s"] * 1e3, marker="o" if not r["held_out"] else "x",
                    color={"direct": "C0", "levels": "C4", "servers": "C2", "ring": "C1"}[p.schedule], s=18)
    lo = min(min(r["point"].measured_s, r["predicted_s"]) for r in result["points"]) * 1e3
    hi = max(max(r["point"].measured_s, r["predicted_s"]) for r in result["points"]) * 1e3
    ax1.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax1.plot([lo, hi], [lo * 1.15, hi * 1.15], "k:", lw=0.6)
    ax1.plot([lo, hi], [lo / 1.15, hi / 1.15], "k:", lw=0.6)
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("measured ms")
    ax1.set_ylabel("model ms")
    ax1.set_title("measured vs model (o: fitted on, x: held out; blue Fairring, green servers, orange gloo ring)",
                  fontsize=8)
    gb = 100 if any(r["gbit"] == 100 for r in extra) else extra[0]["gbit"]
    for s, style in ((1 << 20, "-"), (256 << 20, "--")):
        rows = [r for r in extra if r["gbit"] == gb and r["size"] == s]
        for i, sched in enumerate(SCHEDULES):
            ax2.plot([r["nodes"] for r in rows], [r["bound"] / r[sched] for r in rows], style, color=f"C{i}",
                     label=f"{sched}, {metrics.fmt_size(s)}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("nodes")
    ax2.set_ylabel("link bound / time")
    ax2.set_title(f"extrapolated, {gb} Gbit/s links, one rank per node", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(dirs: Sequence[str], out_dir: str, hold_nodes=(8,), hold_rates=()) -> int:
    points = load_points(dirs)
    if not any(p.schedule == "direct" for p in points):
        print(f"fairring bench --model: no all-reduce results of one rank per node with capped links under "
              f"{', '.join(dirs)} (run the bench with --netns --link-rate ... --ranks-per-node 1)")
        return 2
    result = check(points, hold_nodes, hold_rates)
    if "fairring" not in result["params"]:
        print("fairring bench --model: every Fairring point is held out; nothing to fit on")
        return 2
    extra = extrapolate(result["params"]["fairring"])
    text = format_report(result, extra)
    print(text, end="")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.md"), "w") as f:
        f.write(text)
    png = plot(result, extra, os.path.join(out_dir, "model.png"))
    print(f"wrote {os.path.join(out_dir, 'model.md')}" + (f" and {png}" if png else ""))
    return 0
