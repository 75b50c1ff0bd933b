"""What one process reading another's memory costs on this machine
(Linux cross-memory attach, ``process_vm_readv``, the single-copy transport
MPI libraries use between ranks of a node), against Fairring's own send/recv
within a node, which copies twice through a shared ring (sender in, receiver
out) with the two copies overlapping.

    python3 benchmarks/single_copy_cost.py

A child process fills a buffer and waits; the parent reads it with
process_vm_readv into its own buffer, and copies its own buffer with
torch (one memcpy, for scale), sizes 256 KiB to 25 MiB, microseconds per
read, median of repeats.  docs/BENCHMARKS_HISTORY.md ("Single copy between
node-mates") compares these with a prototype that used them for send/recv.
"""
from __future__ import annotations

import ctypes
import os
import signal
import statistics
import sys
import time

import torch


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    readv = libc.process_vm_readv
    readv.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.POINTER(IoVec), ctypes.c_ulong,
                      ctypes.c_ulong]
    readv.restype = ctypes.c_ssize_t
    biggest = 25 << 20
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "sender": its own buffer, touched, then it waits
        src = torch.ones(biggest, dtype=torch.uint8)
        os.write(w, src.data_ptr().to_bytes(8, "little"))
        signal.pause()
        os._exit(0)
    address = int.from_bytes(os.read(r, 8), "little")
    dst = torch.zeros(biggest, dtype=torch.uint8)
    mine = torch.ones(biggest, dtype=torch.uint8)
    print(f"{'size':>8} {'process_vm_readv us':>20} {'GB/s':>6} {'memcpy us':>10} {'GB/s':>6}")
    try:
        for size in (256 << 10, 1 << 20, 4 << 20, 25 << 20):
            reps = max(5, (64 << 20) // size)
            local, remote = IoVec(dst.data_ptr(), size), IoVec(address, size)
            cma, copy = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                n = readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
                cma.append(time.perf_counter() - t0)
                if n != size:
                    print(f"process_vm_readv: {os.strerror(ctypes.get_errno())} (ptrace rules forbid it here?)")
                    return 1
                t0 = time.perf_counter()
                dst[:size].copy_(mine[:size])
                copy.append(time.perf_counter() - t0)
            a, b = statistics.median(cma), statistics.median(copy)
            print(f"{size >> 10:>6}Ki {a * 1e6:>20.1f} {size / a / 1e9:>6.1f} {b * 1e6:>10.1f} {size / b / 1e9:>6.1f}")
        if not torch.equal(dst, mine):
            print("the bytes read differ from the child's")
            return 1
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
