"""Deterministic inputs and independent references for all-reduce checks.

Every rank can build every rank's input from (seed, rank) alone, so the
reference result is computed locally, in float64 (or int64 / bool), without
any communication.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

R = dist.ReduceOp

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX_DTYPES = [torch.complex64, torch.complex128]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool] + COMPLEX_DTYPES

FLOAT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
BOOL_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
COMPLEX_OPS = ["SUM", "AVG"]

SIZES = [1, 2, 3, 13, 127, 1031, 4099, 65537]
BIG = 3_000_017


def ops_for(dtype):
    if dtype in FLOAT_DTYPES:
        return FLOAT_OPS
    if dtype in COMPLEX_DTYPES:
        return COMPLEX_OPS
    if dtype == torch.bool:
        return BOOL_OPS
    return INT_OPS


def matrix():
    """(dtype, op) pairs of the full supported matrix."""
    return [(dt, op) for dt in ALL_DTYPES for op in ops_for(dt)]


def _gen(seed: int, rank: int):
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + rank * 7919 + 12345) & 0x7FFF_FFFF_FFFF)
    return g


def make_input(seed: int, rank: int, numel: int, dtype, op: str) -> torch.Tensor:
    """Input of `rank` for a case; identical on every process."""
    g = _gen(seed, rank)
    if dtype == torch.bool:
        return torch.rand(numel, generator=g, dtype=torch.float64) < 0.5
    if dtype in INT_DTYPES:
        info = torch.iinfo(dtype)
        # Full range: SUM / PRODUCT must wrap like torch.
        return torch.randint(info.min, info.max, (numel,), generator=g, dtype=torch.int64).to(dtype)
    if dtype in COMPLEX_DTYPES:
        x = torch.rand(numel, 2, generator=g, dtype=torch.float64) * 2 - 1
        return torch.view_as_complex(x).to(dtype)
    x = torch.rand(numel, generator=g, dtype=torch.float64)
    if op == "PRODUCT":
        # magnitudes in [0.5, 1.5): no overflow / underflow in half types
        sign = torch.where(torch.rand(numel, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
        x = sign * (0.5 + x)
    else:
        x = x * 2 - 1
    return x.to(dtype)


def reference(inputs, dtype, op: str) -> torch.Tensor:
    """Exact (ints/bool) or float64 (floats) reduction of the ranks' inputs."""
    w = len(inputs)
    if dtype == torch.bool:
        s = torch.stack(inputs)
        if op in ("SUM", "MAX", "BOR"):
            return s.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return s.all(0)
        if op == "BXOR":
            return (s.to(torch.int64).sum(0) % 2).bool()
        raise ValueError(op)
    if dtype in INT_DTYPES:
        s = torch.stack([t.to(torch.int64) for t in inputs])
        if op == "SUM":
            r = s.sum(0)  # wraps in int64; the cast below wraps to the dtype
        elif op == "PRODUCT":
            r = s[0].clone()
            for t in s[1:]:
                r = r * t
        elif op == "MIN":
            r = s.min(0).values
        elif op == "MAX":
            r = s.max(0).values
        elif op in ("BAND", "BOR", "BXOR"):
            r = s[0].clone()
            for t in s[1:]:
                r = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op](r, t)
        else:
            raise ValueError(op)
        return r.to(dtype)
    if dtype in COMPLEX_DTYPES:
        s = torch.stack([t.to(torch.complex128) for t in inputs])
        r = s.sum(0)
        return r / w if op == "AVG" else r
    s = torch.stack([t.to(torch.float64) for t in inputs])
    if op == "SUM":
        return s.sum(0)
    if op == "AVG":
        return s.sum(0) / w
    if op == "PRODUCT":
        return s.prod(0)
    if op == "MIN":
        return s.min(0).values
    if op == "MAX":
        return s.max(0).values
    raise ValueError(op)


def _eps(dtype):
    return torch.finfo(dtype).eps


def compare(out: torch.Tensor, inputs, ref: torch.Tensor, dtype, op: str):
    """None if `out` matches the reference within the dtype's tolerance, else a
    short description of the worst mismatch."""
    if out.dtype != dtype:
        return f"output dtype {out.dtype} != {dtype}"
    if out.shape != ref.shape:
        return f"output shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if dtype == torch.bool or dtype in INT_DTYPES:
        if torch.equal(out, ref):
            return None
        bad = (out != ref).nonzero().flatten()
        i = int(bad[0])
        return f"{bad.numel()} wrong elements; first at {i}: got {out[i].item()} expected {ref[i].item()}"
    w = len(inputs)
    if dtype in COMPLEX_DTYPES:
        real_dt = torch.float32 if dtype == torch.complex64 else torch.float64
        o = torch.view_as_real(out).to(torch.float64)
        r = torch.view_as_real(ref)
        mag = torch.stack([torch.view_as_real(t.to(torch.complex128)).abs() for t in inputs]).sum(0)
        eps = _eps(real_dt)
    else:
        o = out.to(torch.float64)
        r = ref
        eps = _eps(dtype)
        if op in ("SUM", "AVG"):
            mag = torch.stack([t.to(torch.float64).abs() for t in inputs]).sum(0)
        else:
            mag = r.abs()
    if op in ("MIN", "MAX"):
        # The result is one of the inputs: exact.
        if torch.equal(o, r):
            return None
        bad = (o != r).nonzero().flatten()
        i = int(bad[0])
        return f"{bad.numel()} wrong elements; first at {i}: got {o[i].item()} expected {r[i].item()}"
    # Each intermediate rounding to the dtype (at most one per rank / hop, plus
    # the final cast) costs at most eps/2 of the running magnitude; AVG may add
    # one rounding for the division (or one per input when pre-scaling).
    if op == "AVG":
        mag = mag / w
        tol = (w + 2) * (eps / 2) * mag + 1e-300
    else:
        tol = (w + 1) * (eps / 2) * mag + 1e-300
    if not torch.isfinite(o).all():
        return "non-finite values in output"
    err = (o - r).abs()
    if (err <= tol).all():
        return None
    excess = err / tol
    i = int(excess.argmax()) if excess.dim() == 1 else int(excess.flatten().argmax())
    ofl, rfl, efl, tfl = o.flatten(), r.flatten(), err.flatten(), tol.flatten()
    return (
        f"{int((err > tol).sum())} elements out of tolerance; worst at {i}: "
        f"got {ofl[i].item()!r} expected {rfl[i].item()!r} (err {efl[i].item():.3g} > tol {tfl[i].item():.3g})"
    )


def digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous()
    if t.dtype in COMPLEX_DTYPES:
        t = torch.view_as_real(t).contiguous()
    b = t.view(-1).view(torch.uint8) if t.dtype != torch.bool else t.view(-1).to(torch.uint8)
    return hashlib.sha1(b.numpy().tobytes()).hexdigest()[:16]


def op_of(name: str):
    return getattr(R, name)


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")
