"""Where the time of an all-reduce between many simulated nodes goes on the
wire: qdisc drops (at the switch's ports and at each node's own link), TCP
counters in the nodes' namespaces (retransmissions and timeouts, tail-loss
probes, receive queues pruned or collapsed, zero windows), and the bytes and
packets the nodes' links sent, for Fairring and gloo run one after the other
on the same cluster (root; the bench's network namespaces, bench/netns.py).

    python3 benchmarks/rail_drops.py                            # 16 nodes, 100 Mbit/s, 4 MiB
    N=16 RATE=1gbit SIZE=25M python3 benchmarks/rail_drops.py   # 16 nodes, 1 Gbit/s, 25 MiB
    FAIRRING_RAIL_SEND_WINDOW=0 python3 benchmarks/rail_drops.py fairring   # the rails unpaced

Arguments: the backends to run (default: fairring gloo).  Each runs ITERS
(default 4) all-reduces after 2 warm-up ones, one rank per node; the time per
op is rank 0's, between barriers.  Every rank's result is checked.
"""
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def rank_main(backend: str, size: int, iters: int) -> None:
    import torch
    import torch.distributed as dist

    import fairring_py  # noqa: F401  registers "fairring"

    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((size // 4,), float(rank))
    for _ in range(2):
        dist.all_reduce(x)
    x.fill_(float(rank))
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(iters):
        dist.all_reduce(x)
        if i == 0:
            want = float(world * (world - 1) // 2)
            assert torch.all(x == want), f"rank {rank}: wrong all-reduce result"
            x.fill_(float(rank))
    dist.barrier()
    if rank == 0:
        print(f"{backend}: {(time.perf_counter() - t0) / iters * 1e3:.1f} ms per all-reduce", flush=True)
    dist.destroy_process_group()


# TCP counters read in every node's namespace: retransmissions and timeouts,
# then what a receiver that does not read fast enough costs the kernel
# (queues pruned and collapsed, zero windows advertised).
NSTAT = ["TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtPruneCalled", "TcpExtTCPRcvCollapsed", "TcpExtTCPToZeroWindowAdv",
         "TcpExtTCPSpuriousRTOs", "TcpExtTCPLossProbes"]


def counters(cluster) -> tuple:
    """(qdisc drops at the switch's ports, at the nodes' links, bytes and
    packets the nodes' links sent, then NSTAT's counters in order), summed
    over the cluster."""
    def run(cmd):
        return subprocess.run(cmd, capture_output=True, text=True).stdout

    def dropped(ns):
        return sum(int(m) for m in re.findall(r"dropped (\d+)", run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc"])))

    at_switch = dropped(cluster.switch)
    at_nodes = sent = packets = 0
    tcp = dict.fromkeys(NSTAT, 0)
    for ns in cluster.node_ns:
        at_nodes += dropped(ns)
        for b, p in re.findall(r"Sent (\d+) bytes (\d+) pkt", run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc"])):
            sent += int(b)
            packets += int(p)
        for line in run(["ip", "netns", "exec", ns, "nstat", "-az"] + NSTAT).splitlines():
            name, *rest = line.split() or [""]
            if name in tcp:
                tcp[name] += int(rest[0])
    return (at_switch, at_nodes, sent, packets, *tcp.values())


def main() -> None:
    from fairring_py.bench.metrics import parse_rate, parse_size
    from fairring_py.bench.netns import Cluster

    n = int(os.environ.get("N", "16"))
    rate = parse_rate(os.environ.get("RATE", "100mbit"))
    size = parse_size(os.environ.get("SIZE", "4M"))
    iters = int(os.environ.get("ITERS", "4"))
    backends = sys.argv[1:] or ["fairring", "gloo"]
    print(f"{n} nodes x 1 rank, links of {os.environ.get('RATE', '100mbit')}, all-reduce of {size} bytes, "
          f"FAIRRING_RAIL_SEND_WINDOW={os.environ.get('FAIRRING_RAIL_SEND_WINDOW', 'default')}", flush=True)
    with Cluster(n, rate) as c:
        for port, backend in enumerate(backends):
            before = counters(c)
            procs = []
            for r in range(n):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR=c.address(0),
                           MASTER_PORT=str(29700 + port), FAIRRING_NODE_ID=str(r), **c.rank_env(r))
                cmd = c.exec_prefix(r) + [sys.executable, os.path.abspath(__file__), "--rank", backend, str(size),
                                          str(iters)]
                procs.append(subprocess.Popen(cmd, env=env))
            codes = [p.wait() for p in procs]
            after = counters(c)
            d = [a - b for a, b in zip(after, before)]
            print(f"  {backend}: exit codes {sorted(set(codes))}; qdisc drops at the switch {d[0]}, at the nodes' "
                  f"links {d[1]}; TCP segments retransmitted {d[4]}, retransmission timeouts {d[5]}; "
                  f"{d[2] / n / (iters + 2) / 1024:.1f} KiB in {d[3] / n / (iters + 2):.0f} packets sent per node and op "
                  "(warm-up ops and set-up included); "
                  + ", ".join(f"{k[6:] if k.startswith('TcpExt') else k} {v}" for k, v in zip(NSTAT[2:], d[6:])),
                  flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
