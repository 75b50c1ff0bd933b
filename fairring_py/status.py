"""A live view of a running Fairring job: for every rank and process group,
how many collectives and point-to-point ops it has issued and seen end, what
is in flight and for how long, and which ranks the others wait for.

From a shell, pointed at the job's store (by default MASTER_ADDR:MASTER_PORT,
as torchrun sets them)::

    python -m fairring_py.status --store tcp://host:29500

or from any rank: ``fairring_py.status.collect()`` (the default group's
store) and ``fairring_py.status.format(...)``.

How: each process of the job keeps one thread blocked in ``accept()`` on a
socket of its own and writes the socket's address (and a token the caller
must present) into the job's store when its first Fairring group is created.
The view connects to every rank and reads its groups' counters: nothing runs,
polls or is written while nobody asks.  FAIRRING_STATUS=off turns it off.
"""

import argparse
import json
import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist

from ._status_listener import KEY as _KEY, root_store as _root_store

_CONNECT_TIMEOUT_S = 5.0


def open_store(url: str, timeout_s: float = 10.0):
    """A client of the job's store: tcp://host:port (TCPStore) or file:///path
    (FileStore)."""
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"fairring.status: --store {url!r}: expected tcp://host:port")
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    if url.startswith("file://"):
        return dist.FileStore(url[len("file://"):], -1)
    raise ValueError(f"fairring.status: --store {url!r}: expected tcp://host:port or file:///path")


def _ask(addr: str, token: str, timeout_s: float) -> dict:
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.settimeout(timeout_s)
        s.sendall(token.encode() + b"\n")
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def collect(store=None, timeout_s: float = _CONNECT_TIMEOUT_S) -> dict:
    """Every rank's answer: {global rank: its snapshot, or {"unreachable": why}}.
    `store`: the job's store (None: the default group's, from a rank)."""
    if store is None:
        store = dist.distributed_c10d._get_default_store()
    store = _root_store(store)
    try:
        store.wait([f"{_KEY}world"], timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(
            "fairring.status: no Fairring rank has registered in this store (is it the job's store, and has "
            f"a Fairring group been created with FAIRRING_STATUS on?): {e}") from None
    world = int(store.get(f"{_KEY}world"))
    answers = {}
    for r in range(world):
        if not store.check([f"{_KEY}{r}"]):
            answers[r] = {"unreachable": "not registered (no Fairring group created on it yet)"}
            continue
        addr, token, pid, host = store.get(f"{_KEY}{r}").decode().split(" ", 3)
        try:
            answers[r] = _ask(addr, token, timeout_s)
        except (OSError, ValueError) as e:
            answers[r] = {"unreachable": f"{addr} (pid {pid} on {host}): {e}"}
    return answers


def _age(op) -> str:
    # None: torch's flight recorder, which holds the op's times, no longer has it.
    ago = op.get("started_ms_ago")
    return "an unknown time" if ago is None else f"{ago / 1000:.1f} s"


def analyze(answers: dict) -> list:
    """Per group (by name): its ranks' counts, and who the others wait for."""
    groups = {}
    for grank, ans in answers.items():
        for g in ans.get("groups", []):
            name = g.get("group_name", "")
            if g.get("global_rank") is not None and g["global_rank"] != grank:
                continue  # a process of several ranks (threads) answers for all of them
            groups.setdefault(name, {"desc": g.get("group_desc", ""), "size": g.get("size"), "ranks": {}})
            groups[name]["ranks"][g.get("rank")] = dict(g, answered_as=grank)
    out = []
    for name, g in groups.items():
        rows = g["ranks"]
        # Collectives are compared by count: every rank issues the same
        # ones in the same order.  Sends and receives pair up between two
        # ranks, so their counts say nothing of who is behind.
        behind = []
        issued = {r: row["collectives_issued"] for r, row in rows.items()}
        most = max(issued.values(), default=0)
        for r, n in sorted(issued.items()):
            if n < most:
                ahead = sorted(q for q, m in issued.items() if m > n)
                waiting = [op for q in ahead for op in rows[q]["ops"]
                           if op["state"] == "in flight" and not op["p2p"] and op["seq"] == n]
                what = f" (they wait in {waiting[0]['kind']}, for {_age(waiting[0])})" if waiting else ""
                behind.append(f"rank {r} has issued {n} collective(s), rank(s) {ahead} {most}: rank {r} "
                              f"has not called collective #{n}{what}")
        missing = [r for r in range(g["size"] or 0) if r not in rows]
        out.append({"name": name, "desc": g["desc"], "size": g["size"], "rows": rows, "behind": behind,
                    "missing": missing})
    return out


def format(answers: dict) -> str:  # noqa: A001  (the module's verb: fairring_py.status.format)
    lines = []
    reached = [r for r, a in answers.items() if "unreachable" not in a]
    lines.append(f"fairring status: {len(reached)} of {len(answers)} rank(s) answered")
    for r, a in sorted(answers.items()):
        if "unreachable" in a:
            lines.append(f"  rank {r}: no answer: {a['unreachable']}")
    for g in analyze(answers):
        title = f"group {g['name']!r}" + (f" ({g['desc']})" if g["desc"] else "") + f", {g['size']} rank(s)"
        lines.append("")
        lines.append(title)
        lines.append("  rank  global  collectives issued/ended  p2p issued/ended  in flight")
        for r, row in sorted(g["rows"].items()):
            flying = [op for op in row["ops"] if op["state"] == "in flight"]
            fly = ", ".join(f"{op['kind']} #{op['seq']} for {_age(op)}" for op in flying[:3]) or "-"
            if len(flying) > 3:
                fly += f", and {len(flying) - 3} more"
            if row.get("error"):
                fly += f"; failed: {row['error'][:120]}"
            coll = f"{row['collectives_issued']}/{row['collectives_ended']}"
            p2p = f"{row['p2p_issued']}/{row['p2p_ended']}"
            lines.append(f"  {r:>4}  {row['answered_as']:>6}  {coll:>24}  {p2p:>16}  {fly}")
        for r in g["missing"]:
            lines.append(f"  {r:>4}  {'?':>6}  (no report: no op on this group yet, or no answer)")
        for b in g["behind"]:
            lines.append(f"  behind: {b}")
        if not g["behind"] and not g["missing"]:
            lines.append("  in step: every rank has issued the same collectives")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fairring_py.status",
        description="What every rank of a running Fairring job is doing: ops issued, ended and in flight, "
                    "per process group, and which ranks the others wait for. Reads the job's store; does not "
                    "stop or slow the job.")
    default = None
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        default = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    ap.add_argument("--store", default=default,
                    help="the job's store: tcp://host:port or file:///path (default: MASTER_ADDR:MASTER_PORT)")
    ap.add_argument("--timeout", type=float, default=_CONNECT_TIMEOUT_S, help="seconds to wait for each rank")
    ap.add_argument("--json", action="store_true", help="print every rank's answer as JSON")
    args = ap.parse_args(argv)
    if not args.store:
        ap.error("--store is needed (or MASTER_ADDR and MASTER_PORT in the environment)")
    try:
        answers = collect(open_store(args.store, args.timeout), args.timeout)
    except (ValueError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(answers, indent=1, default=str))
    else:
        print(format(answers), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
