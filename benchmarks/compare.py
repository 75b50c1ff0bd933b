"""The regression guard: this working tree against another commit, both built,
timed in one run, interleaved, at a handful of points.

    python3 benchmarks/compare.py REF                 # e.g. main, HEAD~3, 3aabfad
    python3 benchmarks/compare.py REF --rounds 5 --points 2x2:all_reduce:25M
    python3 benchmarks/compare.py REF --fresh-buffers # new outputs every op, as trainers pass them
    python3 benchmarks/compare.py REF --points 2+1:all_reduce:25M   # nodes of unequal sizes

REF is built once in a git worktree of its own (``/tmp/fairring-ref-<sha>``,
reused by later runs; ``python setup.py build_ext --inplace``, a few minutes on
2 cores).  The working tree must be built already (``pip install -e .``).  Then,
for each round, every point runs the bench (``python -m fairring_py.bench``) once
with REF's package and once with the working tree's, the order alternating
between rounds, so both see the same machine.  Each bench run times Fairring
against gloo in the same processes; this prints, per point, the working tree's
time over REF's (below 1: faster now) and each build's ratio to gloo, with
their spread over the rounds.  The default points: 1x2 and 2x2; 4 KiB, 1 MiB
and 25 MiB; all_reduce, all_gather and send_recv (~10 minutes for 3 rounds).

Finishing a change to a hot path includes this run against the commit before it
(docs/DEVELOPING.md); a point more than 5% slower needs an explanation.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_POINTS = [f"{topo}:{coll}:4K,1M,25M" for topo in ("1x2", "2x2")
                  for coll in ("all_reduce", "all_gather", "send_recv")]


def git(*args, cwd=ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def build_ref(ref: str, jobs: int) -> str:
    """REF's tree with its extension built in place (cached by commit)."""
    sha = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = os.path.join(tempfile.gettempdir(), f"fairring-ref-{sha[:12]}")
    if not os.path.isdir(tree):
        git("worktree", "add", "--detach", tree, sha)
    built = [f for f in os.listdir(os.path.join(tree, "fairring_py")) if f.startswith("_C") and f.endswith(".so")]
    if not built:
        print(f"building {ref} ({sha[:12]}) in {tree} ...", file=sys.stderr, flush=True)
        env = dict(os.environ, MAX_JOBS=str(jobs))
        r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"compare: building {ref} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return tree


def parse_point(text: str):
    """NxK:COLLECTIVE:SIZES, or nodes of unequal sizes as A+B+...:COLLECTIVE:SIZES."""
    topo, coll, sizes = text.split(":")
    if "+" in topo:
        return {"name": text, "node_sizes": topo.replace("+", ","), "collective": coll, "sizes": sizes}
    nodes, per_node = (int(x) for x in topo.split("x"))
    return {"name": text, "nodes": nodes, "ranks_per_node": per_node, "collective": coll, "sizes": sizes}


def use_this_bench(ref_tree: str) -> None:
    """Puts the working tree's bench (Python only) into REF's tree, so that
    both builds are timed by the same harness, and REF's engine runs layouts
    its own bench had no option for (--node-sizes).  Undone by the next run
    without it (git checkout)."""
    import shutil
    dst = os.path.join(ref_tree, "fairring_py", "bench")
    shutil.rmtree(dst)
    shutil.copytree(os.path.join(ROOT, "fairring_py", "bench"), dst,
                    ignore=shutil.ignore_patterns("__pycache__"))


def run_bench(tree: str, point: dict, args) -> dict:
    """{size: (fairring median s, gloo median s)} of one bench run with `tree`'s package."""
    with tempfile.TemporaryDirectory(prefix="fairring-compare-") as out:
        layout = (["--node-sizes", point["node_sizes"]] if "node_sizes" in point else
                  ["--nodes", str(point["nodes"]), "--ranks-per-node", str(point["ranks_per_node"])])
        cmd = [sys.executable, "-m", "fairring_py.bench", "--collective", point["collective"], *layout,
               "--sizes", point["sizes"], "--time-per-size", str(args.time_per_size), "--no-progress",
               "--out", out]
        if args.fresh_buffers and point["collective"] != "barrier":
            cmd.append("--fresh-buffers")
        env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0:
            sys.exit(f"compare: the bench failed with {tree}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        with open(os.path.join(out, "results.json")) as f:
            rows = json.load(f)["rows"]
    by_size = {}
    for row in rows:
        by_size.setdefault(row["size_bytes"], {})[row["backend"]] = row["median_s"]
    return {size: (b["fairring"], b["gloo"]) for size, b in by_size.items()}


def spread(xs) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ref", help="the commit to compare against (anything git rev-parse takes)")
    p.add_argument("--points", nargs="+", default=DEFAULT_POINTS,
                   help="NODESxRANKS:COLLECTIVE:SIZES or A+B:COLLECTIVE:SIZES each (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--time-per-size", type=float, default=1.5)
    p.add_argument("--fresh-buffers", action="store_true", help="pass --fresh-buffers to every bench run")
    p.add_argument("--jobs", type=int, default=2, help="build jobs for REF (default 2)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per bench run")
    p.add_argument("--this-bench", action="store_true",
                   help="time REF's build with the working tree's bench (implied by a point of unequal nodes, "
                        "A+B:..., which older benches cannot lay out)")
    args = p.parse_args(argv)
    points = [parse_point(t) for t in args.points]
    ref_tree = build_ref(args.ref, args.jobs)
    if args.this_bench or any("node_sizes" in pt for pt in points):
        use_this_bench(ref_tree)
    else:  # REF's own bench (an earlier run may have replaced it)
        git("checkout", "--", "fairring_py/bench", cwd=ref_tree)
        git("clean", "-fdq", "fairring_py/bench", cwd=ref_tree)
    trees = {"ref": ref_tree, "new": ROOT}
    # results[point][size][build] = list of (fairring, gloo) per round
    results = {pt["name"]: {} for pt in points}
    for rnd in range(args.rounds):
        order = ["ref", "new"] if rnd % 2 == 0 else ["new", "ref"]
        for pt in points:
            for build in order:
                for size, pair in run_bench(trees[build], pt, args).items():
                    results[pt["name"]].setdefault(size, {"ref": [], "new": []})[build].append(pair)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    head = (f"working tree ({git('rev-parse', '--short', 'HEAD')}{'+dirty' if git('status', '--porcelain') else ''}) "
            f"against {args.ref} ({git('rev-parse', '--short', args.ref)}), {args.rounds} rounds"
            + (", fresh buffers" if args.fresh_buffers else ""))
    print(head)
    print(f"{'point':<28} {'size':>9}  {'new/ref time':>20}  {'ref vs gloo':>20}  {'new vs gloo':>20}  "
          f"{'ms: ref, new; gloo in their runs':>36}")
    worst = 0.0
    for pt in points:
        for size in sorted(results[pt["name"]]):
            r = results[pt["name"]][size]
            n = min(len(r["ref"]), len(r["new"]))
            ratio = [r["new"][i][0] / r["ref"][i][0] for i in range(n)]
            ref_x = [g / f for f, g in r["ref"]]
            new_x = [g / f for f, g in r["new"]]
            worst = max(worst, statistics.median(ratio))
            ms = [statistics.median(x[k] for x in r[b]) * 1e3 for b in ("ref", "new") for k in (0, 1)]
            print(f"{pt['name'].rsplit(':', 1)[0]:<28} {size:>9}  {spread(ratio):>20}  {spread(ref_x) + 'x':>20}  "
                  f"{spread(new_x) + 'x':>20}  {ms[0]:>8.3f} {ms[2]:>8.3f}; {ms[1]:>8.3f} {ms[3]:>8.3f}")
    print(f"slowest point: new/ref {worst:.2f} (the median over rounds; above 1.05 needs a look)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
