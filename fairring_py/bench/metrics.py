"""Pure helpers of the benchmarks: size and rate parsing, bandwidths, the link
bound (each collective's factors are its record in collectives.py), summary
statistics and iteration counts.  No I/O, so they are unit-tested directly
(tests/test_bench_metrics.py)."""
from __future__ import annotations

import math
import re
from typing import Dict, List, Sequence

from . import collectives

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Default sweep: 4 KiB to 256 MiB, every factor of 4.
DEFAULT_SIZES = [4 * KiB * 4**i for i in range(9)]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)\s*$", re.IGNORECASE)
_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_size(text: str) -> int:
    """'4K', '25M', '25MiB', '1G', '4096' -> bytes (K/M/G are powers of two)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r}: expected bytes or a number with K, M or G (e.g. 4K, 25M, 1G)")
    n = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if n != int(n) or n <= 0:
        raise ValueError(f"bad size {text!r}: must be a positive whole number of bytes")
    return int(n)


def parse_sizes(text: str, elem_size: int = 4) -> List[int]:
    """'4K,1M,25M' or a range '4K:256M' (every factor of 2) or '4K:256M:4'
    (every factor of 4) -> sorted distinct sizes in bytes, each a multiple of
    ``elem_size``."""
    text = str(text).strip()
    if not text:
        raise ValueError("empty size list")
    sizes = set()
    for part in text.split(","):
        if ":" in part:
            fields = part.split(":")
            if len(fields) not in (2, 3):
                raise ValueError(f"bad size range {part!r}: expected LO:HI or LO:HI:FACTOR")
            lo, hi = parse_size(fields[0]), parse_size(fields[1])
            factor = int(fields[2]) if len(fields) == 3 and fields[2].strip().isdigit() else None
            if len(fields) == 3 and (factor is None or factor < 2):
                raise ValueError(f"bad size range {part!r}: FACTOR must be an integer >= 2")
            if lo > hi:
                raise ValueError(f"bad size range {part!r}: LO is larger than HI")
            s = lo
            while s <= hi:
                sizes.add(s)
                s *= factor or 2
        else:
            sizes.add(parse_size(part))
    for s in sizes:
        if s % elem_size:
            raise ValueError(f"size {s} bytes is not a multiple of the element size ({elem_size} bytes)")
    return sorted(sizes)


def parse_rate(text: str) -> float:
    """tc-style link rate '1gbit', '500mbit', '100kbit' -> bytes per second."""
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"bad link rate {text!r}: expected e.g. 1gbit, 500mbit (bits per second)")
    bits = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if bits <= 0:
        raise ValueError(f"bad link rate {text!r}: must be positive")
    return bits / 8


def parse_int_list(text: str, name: str, lo: int = 1) -> List[int]:
    """'2,3,4' -> [2, 3, 4]; every value >= lo."""
    try:
        vals = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
    if not vals or any(v < lo for v in vals):
        raise ValueError(f"{name} must list integers >= {lo}, got {text!r}")
    return vals


def fmt_size(n: int) -> str:
    """4096 -> '4 KiB', 26214400 -> '25 MiB', 16793600 -> '16.0 MiB', 1000 -> '1000 B'."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n // scale} {unit}" if n % scale == 0 else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def algbw(nbytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth, bytes/s: data size over time."""
    return nbytes / seconds if seconds > 0 else float("nan")


# The sized collectives of the microbenchmark (barrier has no size).
COLLECTIVES = tuple(c.name for c in collectives.TABLE if c.sized)


def busbw_factor(world_size: int, collective: str = "all_reduce") -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor, the fraction of
    the data each rank must send (and receive) in an optimal algorithm
    (collectives.TABLE: all_reduce 2(P-1)/P; reduce_scatter, all_gather,
    all_to_all, gather and scatter (P-1)/P of their size; broadcast and
    reduce 1; send_recv 2, a ping-pong crossing once each way)."""
    if world_size <= 0:
        return float("nan")
    c = collectives.BY_NAME.get(collective)
    if c is None or c.busbw is None:
        raise ValueError(f"no busbw factor for {collective!r}")
    return c.busbw(world_size)


def busbw(nbytes: float, seconds: float, world_size: int, collective: str = "all_reduce") -> float:
    return algbw(nbytes, seconds) * busbw_factor(world_size, collective)


def link_bound_s(nbytes: float, nodes: int, rate_bytes_per_s: float, collective: str = "all_reduce",
                 ranks_per_node: int = 1, servers: int = 0) -> float:
    """Least time to run the collective on ``nbytes`` across ``nodes`` nodes
    (``ranks_per_node`` each), each with one full-duplex link of the given
    rate, whatever the algorithm: the share of the bytes that must cross the
    busiest link (collectives.TABLE's link_share; an all-reduce: each node
    sends and receives 2(N-1)/N of the data) over the rate.  0 for a single
    node.

    An all-reduce through ``servers`` M dedicated reduction servers (each
    with a link of the same rate) moves S out and S in on every node's link,
    and N x S / M on every server's: the bound is max(1, N / M) x S / rate."""
    if nodes <= 1:
        return 0.0
    c = collectives.BY_NAME.get(collective)
    if c is None or c.link_share is None:
        raise ValueError(f"no link bound for {collective!r}")
    if servers and c.servers:
        return max(1.0, nodes / servers) * nbytes / rate_bytes_per_s
    return c.link_share(nodes, ranks_per_node) * nbytes / rate_bytes_per_s


def tcp_payload_fraction(mtu: int = 1500) -> float:
    """Share of a link's rate TCP can carry as payload: per frame of mtu + 14
    (Ethernet header, which tbf counts) bytes, mtu - 52 are data (IPv4 20, TCP
    20, timestamps option 12)."""
    return (mtu - 52) / (mtu + 14)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), as numpy's default."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> Dict[str, float]:
    """Median, p10, p90, min, max of a list of times (seconds)."""
    return {
        "median": percentile(samples, 50),
        "p10": percentile(samples, 10),
        "p90": percentile(samples, 90),
        "min": min(samples) if samples else float("nan"),
        "max": max(samples) if samples else float("nan"),
        "n": len(samples),
    }


def step_rows(names: Sequence[str], times: Sequence[Sequence[float]], units_per_step: float, rate_key: str,
              **extra) -> List[Dict]:
    """One row per backend of a training bench: step-time percentiles, the
    throughput ``units_per_step / median`` under ``rate_key`` and its ratio to
    the baseline (the second row).  ``extra`` is copied into every row."""
    rows = []
    for name, ts in zip(names, times):
        st = summarize(ts)
        rows.append({**extra, "backend": name, "median_step_s": st["median"], "p10_step_s": st["p10"],
                     "p90_step_s": st["p90"], rate_key: units_per_step / st["median"]})
    for r in rows:
        r["speedup_vs_baseline"] = r[rate_key] / rows[1][rate_key]
    return rows


def choose_reps(op_seconds: float, target_seconds: float, max_reps: int, nbytes: int,
                buffer_budget: int) -> int:
    """How many operations one timed sample runs back to back: enough that the
    sample lasts about ``target_seconds`` (so the barrier before it and the
    clock's resolution do not dominate small sizes), at most ``max_reps``, and
    with one buffer per operation within ``buffer_budget`` bytes."""
    if op_seconds <= 0 or not math.isfinite(op_seconds):
        want = max_reps
    else:
        want = int(target_seconds / op_seconds)
    by_memory = buffer_budget // max(nbytes, 1)
    return max(1, min(want, max_reps, by_memory))


def choose_samples(sample_seconds: float, budget_seconds: float, min_samples: int, max_samples: int) -> int:
    """How many timed samples per size: as many as fit in the time budget,
    between min_samples and max_samples."""
    if sample_seconds <= 0 or not math.isfinite(sample_seconds):
        return max_samples
    return max(min_samples, min(max_samples, int(budget_seconds / sample_seconds)))
