"""Fault-tolerant DDP with torchft on Fairring: replicas that go on when one dies.

    python examples/torchft_ddp.py                      # Fairring, 3 replicas, one SIGKILLed
    python examples/torchft_ddp.py --backend gloo       # the same with torchft's gloo group
    python examples/torchft_ddp.py --backend both       # both, one after the other, and their ratio

Three replica groups of one rank each train the same model, data-parallel
(each step's gradients all-reduced as one flat bucket through torchft's
Manager); a lighthouse from the torchft package forms a quorum
per step, and the replicas' gradients are all-reduced over a
``fairring_py.torchft.ProcessGroupFairring`` (or torchft's
``ProcessGroupGloo``).  At step ``--kill-at``, replica 1 SIGKILLs itself with
its all-reduce in flight; the others' all-reduce fails at once, they drop
that step (torchft does not commit it) and go on as two; this script restarts
the killed replica, which joins the next quorum, heals from a peer (its model
and optimizer state over torchft's checkpoint transport) and trains on.

What is checked at the end (the exit status is non-zero if any fails):
every replica reaches ``--steps``; for every committed step, every replica
that committed it holds the same parameters afterwards (the checksums agree:
nothing was lost or diverged, the healed replica included); the survivors
kept committing steps while the killed replica was down.  Reported: steps/s
of the survivors over the whole run and over the healthy steps.  Needs the
``torchft`` package (pip install torchft==0.2.0).

Why not torchft's DistributedDataParallel: in torchft 0.2.0 its comm hook
asserts (``assert fut._fut``) when an all-reduce fails, with gloo as with
Fairring, so a replica dies with its peer instead of dropping the step.  The
flat bucket here takes torchft's documented path (``Manager.allreduce``: a
failed all-reduce is reported, the step is not committed).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

KILLED = 1  # which replica dies


def _model(width: int, depth: int) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _checksum(model: nn.Module) -> float:
    # float64 sum of every parameter, weighted so that a swap would show.
    total = 0.0
    for i, p in enumerate(model.parameters()):
        total += (i + 1) * float(p.detach().double().sum())
    return total


def worker(args) -> None:
    from torchft import Manager
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    timeout = timedelta(seconds=args.timeout)
    if args.backend == "fairring":
        from fairring_py.torchft import ProcessGroupFairring

        pg = ProcessGroupFairring(timeout=timeout)
    else:
        pg = ProcessGroupGloo(timeout=timeout)
    torch.manual_seed(0)  # the same initial model everywhere (a healed replica gets it from a peer anyway)
    model = _model(args.width, args.depth)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=pg, min_replica_size=2, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica_{args.worker}", store_addr="localhost", store_port=store.port, rank=0,
                      world_size=1, lighthouse_addr=args.lighthouse, timeout=timeout,
                      quorum_timeout=timedelta(seconds=60), connect_timeout=timedelta(seconds=30))
    optim = OptimizerWrapper(manager, opt)
    params = list(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    log = open(os.path.join(args.out, f"replica{args.worker}.{args.incarnation}.jsonl"), "w", buffering=1)
    gen = torch.Generator().manual_seed(1000 * args.worker + args.incarnation)
    # Train to --steps, and on until a step with every replica in: a restarted
    # replica has rejoined (all replicas stop at the same step).
    complete = True
    while manager.current_step() < args.steps or not complete:
        before = manager.current_step()
        x = torch.randn(args.batch, args.width, generator=gen)
        y = torch.randint(0, 10, (args.batch,), generator=gen)
        optim.zero_grad()  # (also starts this step's quorum)
        loss = loss_fn(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        work = manager.allreduce(flat)  # the average over the quorum's replicas
        if args.worker == KILLED and args.incarnation == 0 and before == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # dies with its all-reduce in flight
        if work.wait():
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        optim.step()  # commits only if every replica of the quorum succeeded
        after = manager.current_step()
        if after > before:
            complete = manager.num_participants() == args.replicas
        log.write(json.dumps({"t": time.time(), "step": after, "committed": after > before,
                              "participants": manager.num_participants(), "loss": float(loss),
                              "checksum": _checksum(model)}) + "\n")
    log.close()
    manager.shutdown(wait=False)
    os._exit(0)  # the manager's threads and servers: nothing left to wait for


def _read(out: str, replica: int) -> list:
    rows = []
    for name in sorted(os.listdir(out)):
        if name.startswith(f"replica{replica}.") and name.endswith(".jsonl"):
            with open(os.path.join(out, name)) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    return rows


def run(backend: str, args) -> dict:
    """One job: a lighthouse, three replicas, the kill and the restart.
    Returns the figures and the problems found."""
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse's log: every quorum at INFO
    from torchft._torchft import LighthouseServer

    out = tempfile.mkdtemp(prefix=f"fairring-torchft-{backend}-")
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=200, heartbeat_timeout_ms=1000)
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def start(i: int, incarnation: int) -> subprocess.Popen:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(i), "--incarnation", str(incarnation),
               "--backend", backend, "--lighthouse", lighthouse.address(), "--out", out]
        for k in ("steps", "kill_at", "width", "depth", "batch", "timeout"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        return subprocess.Popen(cmd, env=env, stdout=open(os.path.join(out, f"replica{i}.{incarnation}.out"), "w"),
                                stderr=subprocess.STDOUT)

    t0 = time.time()
    procs = {i: start(i, 0) for i in range(args.replicas)}
    restarted = False
    deadline = t0 + args.job_timeout
    problems = []
    while procs and time.time() < deadline:
        for i, p in list(procs.items()):
            rc = p.poll()
            if rc is None:
                continue
            del procs[i]
            if i == KILLED and rc == -signal.SIGKILL and not restarted:
                restarted = True
                procs[i] = start(i, 1)
            elif rc != 0:
                problems.append(f"replica {i} exited with {rc} (log: {out}/replica{i}.*.out)")
        time.sleep(0.05)
    for i, p in procs.items():
        p.kill()
        problems.append(f"replica {i} still running after {args.job_timeout} s (log: {out}/replica{i}.*.out)")
    wall = time.time() - t0
    lighthouse.shutdown()
    if not restarted:
        problems.append(f"replica {KILLED} was never killed")
    rows = {i: _read(out, i) for i in range(args.replicas)}
    # Every committed step: the same parameters on every replica that committed it.
    by_step = {}
    for i, rs in rows.items():
        for r in rs:
            if r["committed"]:
                by_step.setdefault(r["step"], {})[i] = r["checksum"]
    for step, sums in sorted(by_step.items()):
        vals = list(sums.values())
        if max(vals) - min(vals) > 1e-9 * max(1.0, abs(vals[0])):
            problems.append(f"step {step}: replicas disagree on the parameters: {sums}")
    last = {i: rs[-1]["step"] if rs else 0 for i, rs in rows.items()}
    if min(last.values()) < args.steps or len(set(last.values())) != 1:
        problems.append(f"the replicas stopped at steps {last}, expected one step >= {args.steps}")
    # The survivors went on while the killed replica was away (steps with 2 participants).
    survivors = [i for i in range(args.replicas) if i != KILLED]
    alone = [r for r in rows[survivors[0]] if r["committed"] and r["participants"] == args.replicas - 1]
    if not alone:
        problems.append("the survivors committed no step without the killed replica")
    rejoined = [r for r in rows[KILLED] if r["committed"] and r["step"] > args.kill_at]
    if not rejoined:
        problems.append(f"replica {KILLED} never committed a step after its restart")
    # Steps/s of a survivor: over the whole run, and over steps where all were in.
    s = [r for r in rows[survivors[0]] if r["committed"]]
    full = [(a, b) for a, b in zip(s, s[1:]) if b["participants"] == args.replicas and a["participants"] == args.replicas]
    figures = {
        "backend": backend,
        "wall_s": wall,
        "steps_per_s_whole_run": (len(s) - 1) / (s[-1]["t"] - s[0]["t"]) if len(s) > 1 else 0.0,
        "steps_per_s_healthy": len(full) / sum(b["t"] - a["t"] for a, b in full) if full else 0.0,
        "steps_alone": len(alone),
        "uncommitted_attempts": sum(1 for r in rows[survivors[0]] if not r["committed"]),
        "problems": problems,
        "out": out,
    }
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="fairring", choices=["fairring", "gloo", "both"])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=15)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (the model is depth x width^2 floats)")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=10.0, help="the process group's timeout (s)")
    ap.add_argument("--job-timeout", type=float, default=300.0)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args)
        return
    backends = ["fairring", "gloo"] if args.backend == "both" else [args.backend]
    results = [run(b, args) for b in backends]
    failed = False
    for r in results:
        print(f"{r['backend']}: {r['steps_per_s_whole_run']:.2f} steps/s over the run (kill and heal included), "
              f"{r['steps_per_s_healthy']:.2f} steps/s with every replica in; {r['steps_alone']} steps committed "
              f"by the survivors alone, {r['uncommitted_attempts']} attempt(s) dropped; wall {r['wall_s']:.1f} s; "
              f"logs in {r['out']}")
        for p in r["problems"]:
            print(f"  PROBLEM ({r['backend']}): {p}")
        failed |= bool(r["problems"])
    if len(results) == 2 and all(r["steps_per_s_whole_run"] for r in results):
        f, g = results
        print(f"fairring/gloo: {f['steps_per_s_whole_run'] / g['steps_per_s_whole_run']:.2f}x over the run, "
              f"{f['steps_per_s_healthy'] / max(g['steps_per_s_healthy'], 1e-9):.2f}x healthy")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
