"""A dedicated reduction server for a Fairring job (docs/REDUCTION_SERVERS.md).

    python -m fairring_py.server --store HOST:PORT [--threads N] [--ifname IFACE]
    fairring-server ...                      (the same, installed as a command)

Start any number of them, on any machines that can reach the job's store and
its workers, next to a job whose groups set ``FAIRRING_REDUCTION_SERVERS=M``
(or ``fairring_py.Options(reduction_servers=M)``): the workers' all-reduces
between nodes are then reduced here instead of by the workers, so each
worker's link carries S out and S in (S = bytes per rank) instead of
2(N-1)/N x S each way.

The store is the job's root store: MASTER_ADDR:MASTER_PORT under torchrun or
the env:// init method (the default when --store is not given).  The server
takes the next free index there; a group with M servers uses servers
0..M-1.  It serves every group of the job that uses it, and exits when the
job's store goes away (the job has ended), or on SIGINT / SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from datetime import timedelta


def _parse_store(value: str | None):
    if not value:
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            raise ValueError("give --store HOST:PORT (or set MASTER_ADDR and MASTER_PORT)")
        value = f"{addr}:{port}"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--store must be HOST:PORT, got {value!r}")
    return host, int(port)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairring_py.server", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", help="HOST:PORT of the job's store (default: $MASTER_ADDR:$MASTER_PORT)")
    p.add_argument("--threads", type=int, default=1,
                   help="reduction threads; each rail of a group runs on one (default 1)")
    p.add_argument("--ifname", default=os.environ.get("FAIRRING_SOCKET_IFNAME", ""),
                   help="network interface to listen on (default: $FAIRRING_SOCKET_IFNAME, else the hostname's address)")
    p.add_argument("--connect-timeout", type=float, default=300.0,
                   help="seconds to wait for the job's store to come up (default 300)")
    args = p.parse_args(argv)
    try:
        host, port = _parse_store(args.store)
    except ValueError as e:
        p.error(str(e))
    if args.threads < 1:
        p.error("--threads must be at least 1")

    import torch.distributed as dist

    from . import _C

    _C._quiet_torch_warnings()  # the store going away (the job ending) is no news here
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=args.connect_timeout),
                          wait_for_workers=False)
    server = _C.ReductionServer(store, ifname=args.ifname, threads=args.threads)
    print(f"fairring server {server.index}: listening on {server.address} for the job at {host}:{port}, "
          f"{args.threads} reduction thread(s)", file=sys.stderr, flush=True)

    def on_signal(signum, _frame):
        if running is not None:
            running.stop(f"it received {signal.Signals(signum).name}")

    running = server
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while server.wait(timedelta(milliseconds=200)):
        pass
    print(f"fairring server {server.index}: exiting: {server.stop_reason}; served {server.reductions} reductions "
          f"({server.bytes_in} bytes in) for {server.sessions} rail session(s)", file=sys.stderr, flush=True)
    # Joins its threads now (they send the last aborts), not at interpreter exit.
    running = server = None  # noqa: F841
    return 0


if __name__ == "__main__":
    sys.exit(main())
