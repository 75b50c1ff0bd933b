"""Fairring's options: environment variables, or an ``Options`` object passed as
``pg_options`` to ``init_process_group`` / ``new_group``.  A field set on the
object wins over the environment; unset fields fall back to the environment,
then to the defaults.  Every value is validated here, with an error that names
the variable or field.  The defaults and bounds come from the extension
(csrc/common/config.h), their only copy."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, fields
from typing import Optional

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

from . import _C

DEFAULTS = dict(_C.DEFAULTS)
LIMITS = {k: tuple(v) for k, v in _C.LIMITS.items()}

ENV = {
    "slice_size": "FAIRRING_SLICE_SIZE",
    "total_memory": "FAIRRING_TOTAL_MEMORY",
    "parallelism": "FAIRRING_PARALLELISM",
    "node_id": "FAIRRING_NODE_ID",
    "socket_ifname": "FAIRRING_SOCKET_IFNAME",
    "gpu_transport": "FAIRRING_GPU_TRANSPORT",
    "wire_dtype": "FAIRRING_WIRE_DTYPE",
    "huge_pages": "FAIRRING_HUGE_PAGES",
    "reduction_servers": "FAIRRING_REDUCTION_SERVERS",
    "rail_radix": "FAIRRING_RAIL_RADIX",
}

# How CUDA all-reduces cross nodes.  "tcp": the reduced chunks go through
# pinned host memory over the TCP rails (any Ethernet cluster).  "nccl": NCCL
# point-to-point on rail communicators, device to device (needs a CUDA build,
# NCCL at run time and every rank on its own GPU).
GPU_TRANSPORTS = ("tcp", "nccl")

# What the rails between nodes carry for floating SUM/AVG all-reduces and
# reduce-scatters: "none" (the input dtype), "bf16" or "fp16" (docs/COMPRESSED_RAILS.md,
# "Compressed rails").  Must be the same on every rank.
WIRE_DTYPES = ("none", "bf16", "fp16")

# Fresh CPU outputs (a new torch.empty each step, as FSDP and ZeRO pass):
# "advise" huge pages for their 2 MiB-aligned interior when the machine's
# transparent huge pages are in "madvise" mode, or "off" (docs/USER_GUIDE.md,
# "Fresh output buffers").
HUGE_PAGES = ("advise", "off")

MIN_SLICE, MAX_SLICE = LIMITS["slice_size"]
MAX_PARALLELISM = LIMITS["parallelism"][1]

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB}


@dataclass
class Options:
    """Per-process-group options (``None`` = take the environment or the default).

    slice_size:    bytes per pipelined slice (FAIRRING_SLICE_SIZE, default 1 MiB; unset, a group of
                   several nodes uses 256 KiB per rank, up to 4 MiB)
    total_memory:  staging memory per rank, bytes (FAIRRING_TOTAL_MEMORY, default 64 MiB)
    parallelism:   slices in flight at once (FAIRRING_PARALLELISM, default 4)
    node_id:       name of this rank's node; overrides detection (FAIRRING_NODE_ID)
    socket_ifname: network interface for the TCP listener (FAIRRING_SOCKET_IFNAME)
    gpu_transport: how CUDA all-reduces cross nodes: "tcp" or "nccl" (FAIRRING_GPU_TRANSPORT, default tcp)
    wire_dtype:    what the rails between nodes carry: "none", "bf16" or "fp16" (FAIRRING_WIRE_DTYPE, default none)
    huge_pages:    "advise" huge pages for fresh CPU outputs, or "off" (FAIRRING_HUGE_PAGES, default advise)
    reduction_servers: all-reduces between nodes reduced by this many dedicated servers
                   (``python -m fairring_py.server``) instead of the workers (FAIRRING_REDUCTION_SERVERS,
                   default 0: none; docs/REDUCTION_SERVERS.md)
    rail_radix:    nodes per group of the all-reduce's rail levels: 2 is halving-doubling, the node count
                   or more the direct exchange (FAIRRING_RAIL_RADIX, default 0: by node count;
                   docs/ARCHITECTURE.md, "Rails in levels")
    """

    slice_size: Optional[int | str] = None
    total_memory: Optional[int | str] = None
    parallelism: Optional[int | str] = None
    node_id: Optional[str] = None
    socket_ifname: Optional[str] = None
    gpu_transport: Optional[str] = None
    wire_dtype: Optional[str] = None
    huge_pages: Optional[str] = None
    reduction_servers: Optional[int | str] = None
    rail_radix: Optional[int | str] = None


def parse_size(value, name: str, hi: int | None = None) -> int:
    """'1048576', '1M', '64MiB', '256K' -> bytes (powers of two), at most ``hi``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a size in bytes, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise ValueError(
                f"{name} must be a size in bytes such as 1048576, 256K or 1M, got {value!r}"
            )
        n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if n <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if hi is not None and n > hi:
        raise ValueError(f"{name} must be at most {hi} bytes ({_human(hi)}), got {value!r}")
    return n


def _human(n: int) -> str:
    for unit, size in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _parse_int(value, name: str, lo: int, hi: int) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if not lo <= n <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {value!r}")
    return n


@dataclass
class Resolved:
    slice_size: int
    total_memory: int
    parallelism: int
    node_id: Optional[str]
    socket_ifname: str
    gpu_transport: str = "tcp"
    wire_dtype: str = DEFAULTS["wire_dtype"]
    huge_pages: str = DEFAULTS["huge_pages"]
    reduction_servers: int = DEFAULTS["reduction_servers"]
    rail_radix: int = DEFAULTS["rail_radix"]
    # Neither Options nor the environment set the slice size: the backend
    # picks it by the group's shape (larger with many ranks between nodes).
    slice_size_auto: bool = False


def resolve(pg_options=None, environ=None) -> Resolved:
    """Merge ``pg_options`` over the environment over the defaults, validated."""
    env = os.environ if environ is None else environ
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(
            f"fairring: pg_options must be a fairring_py.Options, got {type(pg_options).__name__}"
        )
    raw = {}
    for f in fields(Options):
        given = getattr(pg_options, f.name) if pg_options is not None else None
        if given is not None:
            raw[f.name] = (given, f"Options.{f.name}")
        elif env.get(ENV[f.name], "") != "":
            raw[f.name] = (env[ENV[f.name]], ENV[f.name])

    def value(key):
        return raw.get(key, (DEFAULTS.get(key), ENV[key]))

    v, name = value("slice_size")
    slice_size = parse_size(v, name, MAX_SLICE)
    if slice_size < MIN_SLICE:
        raise ValueError(f"{name} must be at least {MIN_SLICE} bytes, got {v!r}")
    v, name = value("total_memory")
    total_memory = parse_size(v, name, LIMITS["total_memory"][1])
    v, name = value("parallelism")
    parallelism = _parse_int(v, name, 1, MAX_PARALLELISM)

    node_id = None
    if "node_id" in raw:
        v, name = raw["node_id"]
        node_id = str(v).strip()
        if not node_id:
            raise ValueError(f"{name} must not be empty")

    ifname = ""
    if "socket_ifname" in raw:
        v, name = raw["socket_ifname"]
        ifname = str(v).strip()
        try:
            socket.if_nametoindex(ifname)
        except OSError:
            raise ValueError(f"{name}: no network interface named {ifname!r} on this machine") from None
    gpu_transport = _choice(raw, "gpu_transport", GPU_TRANSPORTS, "tcp")
    if gpu_transport == "nccl" and not _built_with_cuda():
        raise ValueError(
            f"{raw['gpu_transport'][1]}=nccl needs fairring_py._C built with CUDA (this build has CPU tensors only); "
            "rebuild with FAIRRING_BUILD_CUDA=1 against a CUDA torch, or use tcp"
        )
    wire_dtype = _choice(raw, "wire_dtype", WIRE_DTYPES, DEFAULTS["wire_dtype"])
    huge_pages = _choice(raw, "huge_pages", HUGE_PAGES, DEFAULTS["huge_pages"])
    v, name = value("reduction_servers")
    reduction_servers = _parse_int(v, name, *LIMITS["reduction_servers"])
    v, name = value("rail_radix")
    rail_radix = _parse_int(v, name, *LIMITS["rail_radix"])
    if rail_radix == 1:
        raise ValueError(f"{name} must be 0 (by node count) or at least 2, got {v!r}")
    return Resolved(slice_size, total_memory, parallelism, node_id, ifname, gpu_transport, wire_dtype, huge_pages,
                    reduction_servers, rail_radix, slice_size_auto="slice_size" not in raw)


def _choice(raw, key: str, choices, default: str) -> str:
    """The option `key` given in `raw` (value, where it came from), one of
    `choices` in any case and spacing, else `default`."""
    if key not in raw:
        return default
    v, name = raw[key]
    got = str(v).strip().lower()
    if got not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {v!r}")
    return got


def _built_with_cuda() -> bool:
    from . import _C

    return bool(_C._built_with_cuda())


def node_key(resolved: Resolved) -> str:
    """Identity of this rank's machine: FAIRRING_NODE_ID, or hostname + boot id
    (two containers on one host share neither, two hosts never share both)."""
    if resolved.node_id is not None:
        return "id:" + resolved.node_id
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "no-boot-id"
    return f"host:{socket.gethostname()}/{boot}"
