"""Touches most of this machine's free memory once (huge pages advised) and
exits: on a virtual machine whose host backs the guest's memory lazily, every
guest frame is then backed, as on a machine that has run a while.

    python3 benchmarks/touch_memory.py [GiB]     # default: free memory less 2 GiB

Fresh 2 MiB pages come from the kernel's free blocks, most of which a newly
booted VM has never touched; each such first touch costs the host's fault and
zeroing as well as the guest's, so timings with fresh buffers on a new VM are
bimodal (docs/BENCHMARKS_HISTORY.md, "One record per op ... fresh receive
buffers").  Run it before such timings to measure the steady state, and say so.
"""
import mmap
import sys
import time

GIB = 1 << 30


def free_gib() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return max(0, info["MemAvailable"] * 1024 // GIB - 2)


def main():
    want = int(sys.argv[1]) if len(sys.argv) > 1 else free_gib()
    t0 = time.time()
    maps = []
    for _ in range(want):
        m = mmap.mmap(-1, GIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
        for off in range(0, GIB, 4096):
            m[off] = 1
        maps.append(m)
    print(f"touched {len(maps)} GiB in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
