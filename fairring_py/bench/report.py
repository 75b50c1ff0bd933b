"""Reports of the microbenchmark: rows with the derived figures, a printed
table, results.json, results.csv and busbw.png (scaling mode: scaling.*).
The plot needs matplotlib; without it the plot is skipped with a message."""
from __future__ import annotations

import csv
import json
import os
import sys
from typing import List, Optional

from . import collectives, metrics

GB = 1e9
CSV_FIELDS = ["size_bytes", "backend", "inflight", "reps", "samples", "median_s", "p10_s", "p90_s", "min_s",
              "max_s", "algbw_GBps", "busbw_GBps", "busbw_of_memcpy", "speedup_vs_baseline", "link_bound_s",
              "bound_over_time", "max_rel_err", "faults_per_op", "cpu_per_op_s", "servers", "cpu_ranks_per_op_s",
              "cpu_servers_per_op_s", "busy_cores", "host_busy_cores"]


def summarize_run(meta: dict, memcpy: dict, backends: List[str], results: List[dict],
                  checks_failed_ranks: int = 0) -> dict:
    """Raw per-size samples -> the rows every output is made of."""
    world = meta["world_size"]
    baseline = backends[1]
    nodes = meta.get("nodes") or 1
    rate = meta.get("link_rate_Bps")
    # busbw and the link bound: the collective's factors (collectives.TABLE).
    collective = meta.get("collective") or "all_reduce"
    # --servers: the backends whose all-reduces go through the reduction servers.
    with_servers = meta.get("with_servers") or {}
    rows = []
    for res in results:
        nbytes = res["size"] * meta["inflight"]  # one timed unit: `inflight` operations
        stats = [metrics.summarize(ts) for ts in res["times"]]
        base_median = stats[backends.index(baseline)]["median"]
        rel = res.get("max_rel_err") or [None] * len(backends)
        faults = res.get("faults_per_op") or [None] * len(backends)
        cpus = res.get("cpu_per_op_s") or [None] * len(backends)
        for k, (name, st, reps, err, flt, cpu) in enumerate(zip(backends, stats, res["reps"], rel, faults, cpus)):
            servers = meta.get("servers", 0) if name in with_servers else 0
            bound = (metrics.link_bound_s(nbytes, nodes, rate, collective, world // nodes, servers) if rate else None)
            bus = metrics.busbw(nbytes, st["median"], world, collective)
            rows.append({
                "size_bytes": res["size"], "backend": name, "inflight": meta["inflight"],
                "reps": reps, "samples": res["samples"],
                "median_s": st["median"], "p10_s": st["p10"], "p90_s": st["p90"],
                "min_s": st["min"], "max_s": st["max"],
                "algbw_GBps": metrics.algbw(nbytes, st["median"]) / GB,
                "busbw_GBps": bus / GB,
                "busbw_of_memcpy": bus / memcpy["concurrent_per_rank_Bps"],
                "speedup_vs_baseline": base_median / st["median"],
                "link_bound_s": bound,
                "bound_over_time": (bound / st["median"]) if bound else None,
                # Compressed rails: max |result - exact| / sum_r |input_r|
                # (busbw counts the uncompressed float32 bytes).
                "max_rel_err": err,
                # Minor page faults per op on the rank that had most: how
                # much of the output was fresh memory.
                "faults_per_op": flt,
                # CPU seconds per op, all threads of the rank that used most.
                "cpu_per_op_s": cpu,
                # Reduction servers this backend's all-reduces go through.
                "servers": servers,
                **_load(res, k),
            })
    checked = sum(r["checked"] for r in results)
    return {
        "meta": meta, "memcpy": memcpy, "backends": backends, "baseline": baseline, "rows": rows,
        "servers": server_pairs(meta, rows),
        "check": {"ok": checks_failed_ranks == 0, "failed_ranks": checks_failed_ranks,
                  "results_checked_per_rank": checked,
                  "errors": [r["error"] for r in results if r["error"]]},
        "raw": [{"size_bytes": r["size"], "reps": dict(zip(backends, r["reps"])), "times_s": dict(zip(backends, r["times"]))}
                for r in results],
    }


def _load(res: dict, k: int) -> dict:
    """Backend k's CPU load in a size's results (worker.cpu_load), None
    where the run did not record it."""
    keys = ("cpu_ranks_per_op_s", "cpu_servers_per_op_s", "cpu_per_server_per_op_s", "busy_cores", "host_busy_cores")
    return {key: (res[key][k] if res.get(key) else None) for key in keys}


def _num(v, scale: float = 1.0, width: int = 10, digits: int = 1) -> str:
    return f"{v * scale:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


def table(summary: dict) -> str:
    m, mc = summary["meta"], summary["memcpy"]
    base = summary["baseline"]
    bounded = any(r["link_bound_s"] for r in summary["rows"])
    coll = collectives.BY_NAME[m.get("collective") or "all_reduce"]
    title = coll.title.format(dtype=m["dtype"], op=m.get("op"), api=m.get("api") or coll.name)
    out = [
        title
        + f" on {m['device']}: {m['world_size']} ranks"
        + (f" = nodes of {'+'.join(map(str, m['node_sizes']))}" if m.get("node_sizes") else
           f" = {m['nodes']} node(s) x {m['ranks_per_node']}" if m.get("nodes") else "")
        + f"; fairring topology {m['fairring_topology']}"
        + (f"; netns links {m['link_rate_Bps'] * 8 / 1e9:g} Gbit/s" if m.get("link_rate_Bps") else
           ("; netns, uncapped links" if m.get("netns") else ""))
        + (f"; {m['inflight']} {coll.plural} in flight per timed unit"
           if m["inflight"] > 1 else ""),
        f"memory copy ({metrics.fmt_size(mc['bytes'])} torch copy_): {mc['alone_Bps'] / GB:.2f} GB/s on one rank "
        f"alone, {mc['concurrent_per_rank_Bps'] / GB:.2f} GB/s per rank with all ranks copying (busbw% uses this)",
        "time: median (p10-p90) over samples of the slowest rank's time per op; busbw = algbw" + coll.busbw_text,
        ("outputs: a new torch.empty output for every op (--fresh-buffers; in-place collectives: the input "
         "written into it first, timed), except fairring-warm's: the same "
         "fairring group on reused outputs, in the same samples" if m.get("fresh_buffers")
         else "outputs: reused (warm) buffers")
        + f"; transparent huge pages: {m.get('thp', 'unknown')}; faults/op = minor page faults per op"
        " (getrusage, the rank with most); cpu us/op = CPU time per op of all of a rank's threads (the rank"
        " with most; a busy-waiting backend shows it here); cores = CPU seconds per second of all ranks (and"
        " servers) during the samples, host = the whole machine's (/proc/stat, the kernel's network work"
        f" included): near {m.get('cpus')} (this machine's CPUs), the CPU, not the network, is the limit",
    ]
    servers = m.get("servers") or 0
    if servers:
        out.append(f"+srv: the same fairring group through {servers} dedicated reduction server(s) (Options("
                   f"reduction_servers={servers})), each on a link like a node's; srv cpu us/op = CPU time per op of"
                   " all servers together")
    if m.get("link_rate_Bps"):
        out.append(f"link bound = {coll.link_text}bytes / link rate"
                   + (f" (+srv: max(1, N/M) x bytes / link rate, M = {servers} servers)" if servers else "")
                   + f"; TCP over 1500-byte frames carries at most {metrics.tcp_payload_fraction() * 100:.1f}% "
                   "of the rate as payload, so bound/time stays below that")
    compressed = any(r.get("max_rel_err") is not None for r in summary["rows"])
    if compressed:
        out.append("fairring-bf16/-fp16: compressed rails (FAIRRING_WIRE_DTYPE); their busbw counts the float32 "
                   "bytes (uncompressed-equivalent), their results are not exact: max rel err = max over elements "
                   "and ranks of |result - exact| / sum over ranks of |input| (docs/COMPRESSED_RAILS.md)")
    wide = 18 if servers else 14  # "fairring-bf16+srv"
    hdr = f"{'size':>9}  {'backend':<{wide}}{'median ms':>11}{'p10-p90 ms':>19}{'algbw GB/s':>12}{'busbw GB/s':>12}" \
          f"{'busbw%cpy':>10}{'vs ' + base:>9}{'faults/op':>10}{'cpu us/op':>10}"
    if servers:
        hdr += f"{'srv cpu us/op':>14}"
    hdr += f"{'cores':>7}{'host':>6}"
    if bounded:
        hdr += f"{'bound ms':>10}{'bound/time':>11}"
    if compressed:
        hdr += f"{'max rel err':>13}"
    out.append(hdr)
    last = None
    for r in summary["rows"]:
        size = metrics.fmt_size(r["size_bytes"]) if r["size_bytes"] != last else ""
        last = r["size_bytes"]
        spread = f"{r['p10_s'] * 1e3:.3f}-{r['p90_s'] * 1e3:.3f}"
        line = (f"{size:>9}  {r['backend']:<{wide}}{r['median_s'] * 1e3:>11.3f}{spread:>19}{r['algbw_GBps']:>12.3f}"
                f"{r['busbw_GBps']:>12.3f}{r['busbw_of_memcpy'] * 100:>9.1f}%{r['speedup_vs_baseline']:>8.2f}x"
                f"{r['faults_per_op'] if r.get('faults_per_op') is not None else float('nan'):>10.0f}"
                f"{r['cpu_per_op_s'] * 1e6 if r.get('cpu_per_op_s') is not None else float('nan'):>10.1f}")
        if servers:
            line += _num(r.get("cpu_servers_per_op_s"), 1e6, 14)
        line += _num(r.get("busy_cores"), 1, 7, 2) + _num(r.get("host_busy_cores"), 1, 6, 2)
        if bounded:
            line += f"{r['link_bound_s'] * 1e3:>10.3f}{r['bound_over_time'] * 100:>10.1f}%"
        if compressed and r.get("max_rel_err") is not None:
            line += f"{r['max_rel_err']:>13.2e}"
        out.append(line)
    c = summary["check"]
    out.append(f"check: OK ({c['results_checked_per_rank']} results compared exactly on every rank"
               + (", but those of compressed rails" if compressed else "") + ")" if c["ok"]
               else f"check: FAILED on {c['failed_ranks']} rank(s): {'; '.join(c['errors'][:3])}")
    return "\n".join(out)


# ---------------------------------------------------------------- reduction servers

SERVERS_FIELDS = ["nodes", "servers", "size_bytes", "backend", "workers_median_s", "workers_bound_s",
                  "workers_bound_over_time", "servers_median_s", "servers_bound_s", "servers_bound_over_time",
                  "speedup", "bound_speedup", "vs_fairring", "workers_busy_cores", "servers_busy_cores",
                  "workers_host_busy_cores", "servers_host_busy_cores", "cpu_ranks_per_op_s",
                  "cpu_servers_per_op_s"]


def server_pairs(meta: dict, rows: List[dict]) -> List[dict]:
    """--servers: per size, each fairring group that went through the
    reduction servers next to its workers-only twin of the same run: the two
    times and link bounds, the speedup (and the bounds' ratio, the most it
    can be), the speedup over plain workers-only fairring, and the CPU load
    of both.  Empty without servers."""
    with_servers = meta.get("with_servers") or {}
    by = {(r["size_bytes"], r["backend"]): r for r in rows}
    out = []
    for r in rows:
        twin = with_servers.get(r["backend"])
        if twin is None:
            continue
        w, plain = by[(r["size_bytes"], twin)], by[(r["size_bytes"], "fairring")]
        bounds = w["link_bound_s"] and r["link_bound_s"]
        out.append({
            "nodes": meta.get("nodes"), "servers": meta.get("servers"), "size_bytes": r["size_bytes"],
            "backend": twin,
            "workers_median_s": w["median_s"], "workers_bound_s": w["link_bound_s"],
            "workers_bound_over_time": w["bound_over_time"],
            "servers_median_s": r["median_s"], "servers_bound_s": r["link_bound_s"],
            "servers_bound_over_time": r["bound_over_time"],
            "speedup": w["median_s"] / r["median_s"],
            "bound_speedup": w["link_bound_s"] / r["link_bound_s"] if bounds else None,
            "vs_fairring": plain["median_s"] / r["median_s"],
            "workers_busy_cores": w.get("busy_cores"), "servers_busy_cores": r.get("busy_cores"),
            "workers_host_busy_cores": w.get("host_busy_cores"), "servers_host_busy_cores": r.get("host_busy_cores"),
            "cpu_ranks_per_op_s": r.get("cpu_ranks_per_op_s"), "cpu_servers_per_op_s": r.get("cpu_servers_per_op_s"),
        })
    return out


def servers_table(pairs: List[dict]) -> str:
    """The rows of server_pairs (one run's or a scaling's), side by side."""
    out = ["reduction servers: each fairring group with M servers (+srv) next to the same group without (workers "
           "only), same run; speedup = workers-only time / +srv time (bound: the bounds' ratio, the most it can "
           "be); vs fairring = plain fairring's time / +srv time; cores = CPU seconds per second of all ranks and "
           "servers, host = the whole machine's",
           f"{'nodes':>5}{'M':>4}{'size':>9}  {'group':<14}{'workers ms':>11}{'bound':>8}{'b/t':>7}"
           f"{'+srv ms':>9}{'bound':>8}{'b/t':>7}{'speedup':>9}{'(bound)':>8}{'vs fairring':>12}"
           f"{'cores':>7}{'+srv':>6}{'host':>6}{'+srv':>6}"]
    for p in pairs:
        out.append(
            f"{p['nodes'] or '-':>5}{p['servers']:>4}{metrics.fmt_size(p['size_bytes']):>9}  {p['backend']:<14}"
            f"{_ms(p['workers_median_s']):>11}" + _num(p["workers_bound_s"], 1e3, 8)
            + _pct(p["workers_bound_over_time"])
            + f"{_ms(p['servers_median_s']):>9}" + _num(p["servers_bound_s"], 1e3, 8)
            + _pct(p["servers_bound_over_time"])
            + f"{p['speedup']:>8.2f}x" + (f"{p['bound_speedup']:>7.2f}x" if p["bound_speedup"] else f"{'-':>8}")
            + f"{p['vs_fairring']:>11.2f}x"
            + _num(p["workers_busy_cores"], 1, 7, 2) + _num(p["servers_busy_cores"], 1, 6, 2)
            + _num(p["workers_host_busy_cores"], 1, 6, 2) + _num(p["servers_host_busy_cores"], 1, 6, 2))
    return "\n".join(out)


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.3f}"


def _pct(v) -> str:
    return f"{v * 100:>6.1f}%" if v is not None else f"{'-':>7}"


def write_csv(path: str, rows: List[dict], fields: List[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def plot_busbw(summary: dict, path: str) -> Optional[str]:
    """busbw vs size, one line per backend, log x; None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    m = summary["meta"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in summary["backends"]:
        rows = [r for r in summary["rows"] if r["backend"] == name]
        ax.plot([r["size_bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker="o", label=name)
    ax.axhline(summary["memcpy"]["concurrent_per_rank_Bps"] / GB, color="gray", linestyle="--",
               label="memcpy per rank (all ranks copying)")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["size_bytes"] for r in summary["rows"]})
    ax.set_xticks(sizes, [metrics.fmt_size(x).replace(" ", "") for x in sizes])
    ax.minorticks_off()
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{m.get('collective') or 'all_reduce'} busbw, {m['world_size']} ranks, fairring topology {m['fairring_topology']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_ylim(0, 1.45 * max([summary["memcpy"]["concurrent_per_rank_Bps"] / GB]
                             + [r["busbw_GBps"] for r in summary["rows"]]))
    ax.legend(loc="upper left", ncol=2, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def emit(summary: dict, out_dir: Optional[str]) -> None:
    """Print the table; with out_dir, write results.json, results.csv, busbw.png
    (and with reduction servers servers.csv: server_pairs)."""
    print(table(summary), flush=True)
    if summary.get("servers"):
        print(servers_table(summary["servers"]), flush=True)
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    write_csv(os.path.join(out_dir, "results.csv"), summary["rows"], CSV_FIELDS)
    if summary.get("servers"):
        write_csv(os.path.join(out_dir, "servers.csv"), summary["servers"], SERVERS_FIELDS)
    png = plot_busbw(summary, os.path.join(out_dir, "busbw.png"))
    note = f", {png}" if png else " (plot skipped: matplotlib is not installed; pip install matplotlib)"
    print(f"wrote {os.path.join(out_dir, 'results.json')}, {os.path.join(out_dir, 'results.csv')}{note}",
          file=sys.stderr, flush=True)


# ---------------------------------------------------------------- scaling mode

SCALING_FIELDS = ["nodes", "size_bytes", "backend", "median_s", "ns_per_byte", "link_bound_s",
                  "bound_ns_per_byte", "bound_over_time", "servers", "busy_cores", "host_busy_cores"]


def scaling_rows(runs: List[dict]) -> List[dict]:
    """One results.json summary per node count -> time per byte rows."""
    rows = []
    for s in runs:
        n = s["meta"]["nodes"]
        for r in s["rows"]:
            nbytes = r["size_bytes"] * r["inflight"]
            rows.append({
                "nodes": n, "size_bytes": r["size_bytes"], "backend": r["backend"], "median_s": r["median_s"],
                "ns_per_byte": r["median_s"] / nbytes * 1e9,
                "link_bound_s": r["link_bound_s"],
                "bound_ns_per_byte": (r["link_bound_s"] / nbytes * 1e9) if r["link_bound_s"] else None,
                "bound_over_time": r["bound_over_time"],
                "servers": r.get("servers", 0), "busy_cores": r.get("busy_cores"),
                "host_busy_cores": r.get("host_busy_cores"),
            })
    return rows


def scaling_table(rows: List[dict]) -> str:
    wide = max([9] + [len(r["backend"]) + 1 for r in rows])
    out = [f"{'nodes':>5}  {'size':>9}  {'backend':<{wide}}{'median ms':>11}{'ns/byte':>10}{'bound ns/B':>11}"
           f"{'bound/time':>11}"]
    for r in rows:
        b = r["bound_ns_per_byte"]
        out.append(f"{r['nodes']:>5}  {metrics.fmt_size(r['size_bytes']):>9}  {r['backend']:<{wide}}"
                   f"{r['median_s'] * 1e3:>11.3f}{r['ns_per_byte']:>10.3f}"
                   + (f"{b:>11.3f}{r['bound_over_time'] * 100:>10.1f}%" if b else f"{'-':>11}{'-':>11}"))
    return "\n".join(out)


def plot_scaling(rows: List[dict], path: str, title: str = "", collective: str = "all_reduce") -> Optional[str]:
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for size in sorted({r["size_bytes"] for r in rows}):
        for name in dict.fromkeys(r["backend"] for r in rows):
            pts = [r for r in rows if r["backend"] == name and r["size_bytes"] == size]
            ax.plot([r["nodes"] for r in pts], [r["ns_per_byte"] for r in pts], marker="o",
                    label=f"{name} {metrics.fmt_size(size)}")
        for through_servers, style in ((False, "--"), (True, ":")):
            seen = {}
            for r in rows:
                if r["size_bytes"] == size and r["bound_ns_per_byte"] and bool(r.get("servers")) == through_servers:
                    seen[r["nodes"]] = r["bound_ns_per_byte"]
            if seen:
                ax.plot(list(seen), list(seen.values()), color="gray", linestyle=style,
                        label=f"link bound{' with servers' if through_servers else ''} {metrics.fmt_size(size)}")
    nodes = sorted({r["nodes"] for r in rows})
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_xlabel("nodes")
    ax.set_ylabel("time per byte (ns/B)")
    ax.set_title(f"{collective} time per byte vs number of nodes{title}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def emit_scaling(runs: List[dict], out_dir: str) -> None:
    """The scaling report (with reduction servers also their side-by-side
    table, scaling_servers.csv and "servers" in scaling.json)."""
    rows = scaling_rows(runs)
    pairs = [p for s in runs for p in s.get("servers") or []]
    print("scaling: time per byte vs nodes\n" + scaling_table(rows), flush=True)
    if pairs:
        print(servers_table(pairs), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "scaling.json"), "w") as f:
        json.dump({"rows": rows, "servers": pairs, "runs": [s["meta"] for s in runs]}, f, indent=1)
    write_csv(os.path.join(out_dir, "scaling.csv"), rows, SCALING_FIELDS)
    if pairs:
        write_csv(os.path.join(out_dir, "scaling_servers.csv"), pairs, SERVERS_FIELDS)
    m = runs[0]["meta"]
    title = f", {m['ranks_per_node']} rank(s)/node" + (
        f", {m['link_rate_Bps'] * 8 / 1e9:g} Gbit/s links" if m.get("link_rate_Bps") else "")
    png = plot_scaling(rows, os.path.join(out_dir, "scaling.png"), title, m.get("collective") or "all_reduce")
    note = f", {png}" if png else " (plot skipped: matplotlib is not installed; pip install matplotlib)"
    print(f"wrote {os.path.join(out_dir, 'scaling.csv')}{note}", file=sys.stderr, flush=True)
