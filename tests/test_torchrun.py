"""The backend works under torchrun (env:// rendezvous), single- and two-node."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import launch

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "torchrun_check.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 150


def _env(node_id=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRRING_")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = "1"
    # the package may be built in place rather than installed
    env["PYTHONPATH"] = os.pathsep.join([REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if node_id is not None:
        env["FAIRRING_NODE_ID"] = node_id
    return env


def _torchrun(extra, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"] + extra + [SCRIPT]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(procs):
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=DEADLINE_S)
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        tails = []
        for p in procs:
            out, _ = p.communicate()
            tails.append(out[-4000:])
        raise AssertionError(f"torchrun did not finish within {DEADLINE_S}s; output tails:\n" + "\n----\n".join(tails))
    return outs


def _ok_lines(out):
    return re.findall(r"FAIRRING_TORCHRUN_OK rank=(\d+) world=(\d+) local_rank=(\d+) listen='([^']*)'", out)


def test_torchrun_single_node():
    port = launch.free_port()
    p = _torchrun(["--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={port}"], _env())
    (out,) = _finish([p])
    assert p.returncode == 0, f"torchrun exit code {p.returncode}\n{out[-6000:]}"
    lines = _ok_lines(out)
    assert sorted(int(r) for r, *_ in lines) == [0, 1], out[-6000:]
    assert all(w == "2" for _, w, _, _ in lines)
    assert all(a == "" for *_, a in lines), f"single node: listen_address must be '': {lines}"


def test_torchrun_two_nodes():
    port = launch.free_port()
    common = ["--nnodes=2", "--master_addr=127.0.0.1", f"--master_port={port}"]
    procs = [_torchrun(common + [f"--node_rank={i}"], _env(f"sim-node-{i}")) for i in range(2)]
    outs = _finish(procs)
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"torchrun node_rank={i} exit code {p.returncode}\n{out[-6000:]}"
    lines = _ok_lines(outs[0]) + _ok_lines(outs[1])
    assert sorted(int(r) for r, *_ in lines) == [0, 1, 2, 3], "\n----\n".join(o[-4000:] for o in outs)
    assert all(w == "4" for _, w, _, _ in lines)
    assert all(re.fullmatch(r".+:\d+", a) for *_, a in lines), f"two nodes: listen_address must be ip:port: {lines}"
