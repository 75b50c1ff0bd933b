"""Reduce-scatter and all-gather checks that run inside the ranks (issue 9).

Spawned by tests/test_reduce_scatter_all_gather.py through launch.run_ranks, in
the style of rank_all_reduce.py: `session(rank, world, sections, cfg)` runs
named sections in one process group and returns {section: {"failures": [...], "native_only": [...], ...}}.

Every result is compared with a reference computed locally on each rank from
every rank's seeded input (refs.make_input / refs.reference / refs.compare, the
all-reduce's own reference code: a reduce-scatter's result is the rank's chunk of
the all-reduce reference, an all-gather's the concatenation of the inputs).

Two kinds of findings are kept apart:
- "failures": wrong results, errors, hangs of things that must work whichever
  path runs them (today: delegated to gloo).
- "native_only": what only Fairring's own reduce-scatter / all-gather can pass
  (issue 9): int16 (gloo's reduce_scatter and allgather raise "Invalid scalar
  type"), other gaps of gloo, and that the ops ran natively (the kinds
  in fairring_py.dump_recent).  The tests named test_native_* assert on these;
  they failed while these collectives were delegated (before bc0910e).
Mismatches between ranks are checked by `mismatch_session`, in a launch of their
own: on the delegated path a size or dtype mismatch aborts the process inside
gloo, which would take every other section down with it.
"""
from __future__ import annotations

import datetime
import io
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import refs
from rank_all_reduce import Failures, _case_name, _run_case, run_sections
from refs import compare, digest, make_input, op_of, reference

# dtypes gloo's reduce_scatter / allgather do not take (RuntimeError "Invalid scalar
# type" in torch 2.13): while these ops are delegated they cannot pass.
GLOO_GAPS = (torch.int16,)

# Kinds in dump_recent: Fairring's own, and what the delegated calls are named
# (csrc/backend/backend.cpp, delegate("...")).
NATIVE_RS, NATIVE_AG = "reduce_scatter", "all_gather"

# torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor (deprecated,
# still what FSDP1 and DeepSpeed call) to reduce_scatter_single / all_gather_single.
HAS_SINGLE = hasattr(dist, "reduce_scatter_single") and hasattr(dist, "all_gather_single")

RS_SIZES = [1, 2, 3, 13, 1031]      # elements per rank (output size); primes and tiny
AG_SIZES = [1, 3, 13, 1031, 4099]
BIG = 262147                         # per rank, prime: several 1 MiB slices, uneven tail


def _chunk(t: torch.Tensor, i: int, n: int) -> torch.Tensor:
    return t.reshape(-1)[i * n:(i + 1) * n]


def _gloo_gap(dtype) -> bool:
    return dtype in GLOO_GAPS


class Checker:
    """Collects failures, routing those of known gloo gaps to native_only."""

    def __init__(self):
        self.failures, self.native_only = Failures(), Failures()

    def add(self, msg, dtype=None, native=False):
        (self.native_only if native or (dtype is not None and _gloo_gap(dtype)) else self.failures).add(msg)

    def result(self, **extra):
        return dict(failures=self.failures, native_only=self.native_only, **extra)


def _last_seq(group=None) -> int:
    import fairring_py

    recs = fairring_py.dump_recent(group, file=io.StringIO())
    return recs[-1]["seq"] if recs else -1


def _kinds_since(seq, group=None):
    import fairring_py

    return [r["kind"] for r in fairring_py.dump_recent(group, file=io.StringIO()) if r["seq"] > seq]


# --------------------------------------------------------------------------
# reduce-scatter

def rs_case(rank, world, seed, dtype, op, n, ck, form="tensor", group=None, members=None, repeat=False,
            digests=None):
    """One reduce-scatter of n elements per rank; checks this rank's chunk against
    the all-reduce reference and that the input is left as it was."""
    members = members if members is not None else list(range(world))
    w = len(members)
    me = members.index(rank)
    inputs = [make_input(seed, r, n * w, dtype, op) for r in members]
    name = _case_name(dtype, op, n, f"/{form}")
    inp = inputs[me].clone()
    out = torch.full((n,), 7, dtype=dtype) if dtype != torch.bool else torch.zeros(n, dtype=torch.bool)

    def run(o):
        if form == "tensor":
            dist.reduce_scatter_tensor(o, inp, op=op_of(op), group=group)
        elif form == "list":
            dist.reduce_scatter(o, list(inp.chunk(w)), op=op_of(op), group=group)
        elif form == "async":
            dist.reduce_scatter_tensor(o, inp, op=op_of(op), group=group, async_op=True).wait()
        elif form == "single":  # torch 2.13's name for reduce_scatter_tensor
            dist.reduce_scatter_single(o, inp, op=op_of(op), group=group)
        else:
            raise ValueError(form)

    try:
        run(out)
    except Exception as e:  # noqa: BLE001
        ck.add(f"reduce_scatter {name}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
        return None
    ref = _chunk(reference(inputs, dtype, op), me, n)
    err = compare(out, [_chunk(x, me, n) for x in inputs], ref, dtype, op)
    if err:
        ck.add(f"reduce_scatter {name}: {err}", dtype)
    if not torch.equal(inp, inputs[me]):
        ck.add(f"reduce_scatter {name}: the input tensor was modified", dtype)
    if digests is not None:
        digests[name] = digest(out)
    if repeat:
        again = torch.empty_like(out)
        run(again)
        if digest(again) != digest(out):
            ck.add(f"reduce_scatter {name}: repeated with the same inputs gave different bits", dtype)
    return out


def _rs_uneven(rank, world, ck, seed):
    """The list form with blocks of unequal sizes (zeros, ones, primes; random
    per case, the same on every rank), every dtype and op: this rank's block
    against the float64 reference, the inputs unchanged."""
    import random
    for ci, (dtype, op) in enumerate(refs.matrix()):
        rnd = random.Random(seed + ci)
        sizes = [rnd.choice([0, 1, 2, 3, 13, 1031, 4099]) for _ in range(world)]
        if ci % 5 == 0:
            sizes[rnd.randrange(world)] = 65537  # several slices for one block, one for the others
        total = sum(sizes)
        inputs = [make_input(seed + ci, r, total, dtype, op) for r in range(world)]
        at = sum(sizes[:rank])
        mine = [x[at:at + sizes[rank]] for x in inputs]
        name = _case_name(dtype, op, sizes[rank], f"/uneven {sizes}")
        blocks = list(inputs[rank].clone().split(sizes))
        out = torch.full((sizes[rank],), 7, dtype=dtype) if dtype != torch.bool else \
            torch.zeros(sizes[rank], dtype=torch.bool)
        try:
            dist.reduce_scatter(out, blocks, op=op_of(op))
        except Exception as e:  # noqa: BLE001
            ck.add(f"reduce_scatter {name}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
            continue
        ref = reference(inputs, dtype, op)[at:at + sizes[rank]]
        err = compare(out, mine, ref, dtype, op)
        if err:
            ck.add(f"reduce_scatter {name}: {err}", dtype)
        if not torch.equal(torch.cat(blocks), inputs[rank]):
            ck.add(f"reduce_scatter {name}: the input tensors were modified", dtype)


def _rs_noncontig(rank, world, ck, seed):
    """Strided / transposed / offset input and output views: the result is the
    logical (row-major) chunk; nothing outside the output view changes."""
    w = world
    f32, bf16, i32, f64, u8 = torch.float32, torch.bfloat16, torch.int32, torch.float64, torch.uint8
    cases = [
        # label, n (elements per rank), input base, input view, output base, output view, dtype, op
        ("input[::2], output[::3] f32 SUM", 1031, lambda n: torch.full((2 * n * w,), -7.0), lambda b: b[::2],
         lambda n: torch.full((3 * n,), -9.0), lambda b: b[::3], f32, "SUM"),
        ("transposed 2-d input and output bf16 AVG", 13 * 9, lambda n: torch.full((9, 13 * w), -7.0, dtype=bf16),
         lambda b: b.t(), lambda n: torch.full((9, 13), -9.0, dtype=bf16), lambda b: b.t(), bf16, "AVG"),
        ("offset views i32 BXOR", 4099, lambda n: torch.full((w * n + 10,), -7, dtype=i32), lambda b: b[3:3 + w * n],
         lambda n: torch.full((n + 5,), -9, dtype=i32), lambda b: b[5:], i32, "BXOR"),
        ("2-d input[:, ::2] and output[:, ::2] f64 MAX", 13 * 17, lambda n: torch.full((17 * w, 26), -7.0, dtype=f64),
         lambda b: b[:, ::2], lambda n: torch.full((17, 26), -9.0, dtype=f64), lambda b: b[:, ::2], f64, "MAX"),
        ("input[1::3], output[::2] uint8 MIN", 65537, lambda n: torch.full((3 * n * w + 1,), 3, dtype=u8),
         lambda b: b[1::3], lambda n: torch.full((2 * n,), 9, dtype=u8), lambda b: b[::2], u8, "MIN"),
    ]
    for i, (label, n, mk_in, view_in, mk_out, view_out, dtype, op) in enumerate(cases):
        in_base = mk_in(n)
        in_view = view_in(in_base)
        out_base = mk_out(n)
        out_view = view_out(out_base)
        assert in_view.numel() == n * world and out_view.numel() == n, (label, in_view.shape, out_view.shape)
        inputs = [make_input(seed + i, r, n * world, dtype, op) for r in range(world)]
        in_view.copy_(inputs[rank].reshape(in_view.shape))
        in_before = in_base.clone()
        mask = torch.ones(out_base.shape, dtype=torch.bool)
        view_out(mask).fill_(False)
        out_before = out_base.clone()
        try:
            dist.reduce_scatter_tensor(out_view, in_view, op=op_of(op))
        except Exception as e:  # noqa: BLE001
            ck.add(f"reduce_scatter non-contiguous {label}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
            continue
        ref = _chunk(reference(inputs, dtype, op), rank, n)
        err = compare(out_view.reshape(-1).clone(), [_chunk(x, rank, n) for x in inputs], ref, dtype, op)
        if err:
            ck.add(f"reduce_scatter non-contiguous {label}: {err}", dtype)
        if not torch.equal(out_base[mask], out_before[mask]):
            ck.add(f"reduce_scatter non-contiguous {label}: elements outside the output view changed", dtype)
        if not torch.equal(in_base, in_before):
            ck.add(f"reduce_scatter non-contiguous {label}: the input was modified", dtype)
    # The list form with non-contiguous inputs and output.  Native only: gloo's
    # reduce_scatter (list form) writes the result as if the output were
    # contiguous from its first element (wrong numbers, and elements outside the
    # view overwritten), torch 2.13.
    n = 517
    inputs = [make_input(seed + 50, r, n * world, torch.float32, "SUM") for r in range(world)]
    bases = [torch.full((n, 2), -7.0) for _ in range(world)]
    views = [b[:, 0] for b in bases]
    for j, v in enumerate(views):
        v.copy_(_chunk(inputs[rank], j, n))
    out_base = torch.full((2 * n,), -9.0)
    try:
        dist.reduce_scatter(out_base[1::2], views)
        ref = _chunk(reference(inputs, torch.float32, "SUM"), rank, n)
        err = compare(out_base[1::2].clone(), [_chunk(x, rank, n) for x in inputs], ref, torch.float32, "SUM")
        if err:
            ck.add(f"reduce_scatter list form, non-contiguous: {err}", native=True)
        if not torch.equal(out_base[0::2], torch.full((n,), -9.0)):
            ck.add("reduce_scatter list form, non-contiguous: elements outside the output view changed", native=True)
    except Exception as e:  # noqa: BLE001
        ck.add(f"reduce_scatter list form, non-contiguous: raised {type(e).__name__}: {str(e)[:300]}", native=True)


def _rs_coalesced(rank, world, ck, seed):
    """reduce_scatter_tensor_coalesced, through torch's _coalescing_manager (sync
    and async), tensors of different sizes and one op."""
    for async_ops in (False, True):
        for dtype, op in ((torch.float32, "SUM"), (torch.int64, "MAX"), (torch.bfloat16, "AVG")):
            sizes = [1, 13, 1031, 4]
            inputs = [[make_input(seed + 10 * k + async_ops, r, n * world, dtype, op) for r in range(world)]
                      for k, n in enumerate(sizes)]
            outs = [torch.empty(n, dtype=dtype) for n in sizes]
            label = f"reduce_scatter_tensor_coalesced {refs.dtype_name(dtype)}/{op} sizes {sizes} async={async_ops}"
            try:
                with dist._coalescing_manager(async_ops=async_ops) as cm:
                    for o, ins in zip(outs, inputs):
                        dist.reduce_scatter_tensor(o, ins[rank].clone(), op=op_of(op))
                if async_ops:
                    cm.wait()
            except Exception as e:  # noqa: BLE001
                ck.add(f"{label}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
                continue
            for o, ins, n in zip(outs, inputs, sizes):
                err = compare(o, [_chunk(x, rank, n) for x in ins], _chunk(reference(ins, dtype, op), rank, n),
                              dtype, op)
                if err:
                    ck.add(f"{label}, n={n}: {err}", dtype)


def _rs_in_place(rank, world, ck, seed):
    """The output is the rank's own block of the input (in place), in the
    tensor form and in the list form (whose blocks are read where they are);
    and, in the list form, the output is another rank's block (read by the
    op: the result must not overwrite it before it is read)."""
    cases = [(torch.float32, "SUM", 1031, "tensor"), (torch.int32, "MAX", 13, "tensor"),
             (torch.bfloat16, "AVG", 4099, "list"), (torch.float64, "SUM", BIG, "tensor"),
             (torch.float32, "SUM", BIG, "list"), (torch.int64, "PRODUCT", 1031, "list, another block")]
    for i, (dtype, op, n, form) in enumerate(cases):
        inputs = [make_input(seed + i, r, n * world, dtype, op) for r in range(world)]
        buf = inputs[rank].clone()
        blocks = [b.clone() for b in buf.chunk(world)] if form != "tensor" else None
        if form == "tensor":
            out = buf[rank * n:(rank + 1) * n]
        else:
            out = blocks[rank if form == "list" else (rank + 1) % world]
        label = f"reduce_scatter in place ({form}: output = a block of the input) {_case_name(dtype, op, n)}"
        try:
            if blocks is not None:
                dist.reduce_scatter(out, blocks, op=op_of(op))
            else:
                dist.reduce_scatter_tensor(out, buf, op=op_of(op))
        except Exception as e:  # noqa: BLE001
            ck.add(f"{label}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
            continue
        err = compare(out.clone(), [_chunk(x, rank, n) for x in inputs], _chunk(reference(inputs, dtype, op), rank, n),
                      dtype, op)
        if err:
            ck.add(f"{label}: {err}", dtype)


def sec_reduce_scatter(rank, world, cfg):
    ck, digests = Checker(), {}
    seed = cfg.get("seed", 1) * 1000 + 77
    sizes = cfg.get("rs_sizes", RS_SIZES)
    forms = ["tensor", "list", "async"] + (["single"] if HAS_SINGLE else [])
    for ci, (dtype, op) in enumerate(refs.matrix()):
        for si, n in enumerate(sizes):
            form = forms[(ci + si) % len(forms)]
            repeat = dtype in refs.FLOAT_DTYPES and op in ("SUM", "AVG", "PRODUCT") and n >= 1031
            rs_case(rank, world, seed + ci * 100 + si, dtype, op, n, ck, form=form, repeat=repeat, digests=digests)
    for bi, (dtype, op) in enumerate(cfg.get("big", [(torch.float32, "SUM")])):
        rs_case(rank, world, seed + 9000 + bi, dtype, op, cfg.get("big_n", BIG), ck, repeat=True, digests=digests)
    _rs_noncontig(rank, world, ck, seed + 20000)
    _rs_coalesced(rank, world, ck, seed + 30000)
    _rs_in_place(rank, world, ck, seed + 35000)
    _rs_uneven(rank, world, ck, seed + 37000)
    # Empty tensors: nothing to do, and the group still works afterwards.
    try:
        dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0))
        rs_case(rank, world, seed + 40000, torch.float32, "SUM", 1031, ck)
    except Exception as e:  # noqa: BLE001
        ck.add(f"reduce_scatter of empty tensors: raised {type(e).__name__}: {str(e)[:300]}")
    # PREMUL_SUM: torch hands it to the backend (gloo refuses it); its own list.
    premul = []
    try:
        n = 1031
        inputs = [make_input(seed + 50000, r, n * world, torch.float32, "SUM") for r in range(world)]
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, inputs[rank].clone(), op=dist._make_nccl_premul_sum(0.5))
        ref = _chunk(reference(inputs, torch.float32, "SUM"), rank, n) * 0.5
        err = compare(out, [_chunk(x, rank, n) * 0.5 for x in inputs], ref, torch.float32, "SUM")
        if err:
            premul.append(f"reduce_scatter PREMUL_SUM(0.5) f32: {err}")
    except Exception as e:  # noqa: BLE001
        premul.append(f"reduce_scatter PREMUL_SUM(0.5) f32: raised {type(e).__name__}: {str(e)[:300]}")
    return ck.result(digests=digests, premul=premul,
                     same_bits=_rs_bits_vs_all_reduce(rank, world, seed + 60000, cfg))


def _rs_bits_vs_all_reduce(rank, world, seed, cfg):
    """The design's fixed reduction order (local-rank order in a node, then node
    order) is the all-reduce's: a native reduce-scatter of the same inputs should
    give this rank's chunk of Fairring's all_reduce result bit for bit.  Native
    only (gloo reduces in another order); a list of differences.  Uneven nodes
    too: a rail reduces its passive ranks' pieces in the same order."""
    diffs = []
    cases = [(torch.float32, "SUM", 1031), (torch.bfloat16, "AVG", 4099), (torch.float16, "SUM", 13),
             (torch.float64, "PRODUCT", 65537), (torch.float32, "SUM", cfg.get("big_n", BIG))]
    for i, (dtype, op, n) in enumerate(cases):
        x = make_input(seed + i, rank, n * world, dtype, op)
        ar = x.clone()
        out = torch.empty(n, dtype=dtype)
        try:
            dist.all_reduce(ar, op=op_of(op))
            dist.reduce_scatter_tensor(out, x, op=op_of(op))
        except Exception as e:  # noqa: BLE001
            diffs.append(f"{_case_name(dtype, op, n)}: raised {type(e).__name__}: {str(e)[:200]}")
            continue
        if digest(out) != digest(_chunk(ar, rank, n)):
            bad = int((_bits(out) != _bits(_chunk(ar, rank, n))).sum())
            diffs.append(f"{_case_name(dtype, op, n)}: reduce_scatter differs from all_reduce's chunk in {bad} bytes")
    return diffs


# --------------------------------------------------------------------------
# all-gather

def _ag_inputs(seed, world, n, dtype):
    return [make_input(seed, r, n, dtype, "SUM") for r in range(world)]


def ag_case(rank, world, seed, dtype, n, ck, form="tensor", digests=None):
    inputs = _ag_inputs(seed, world, n, dtype)
    want = torch.cat(inputs)
    name = _case_name(dtype, "-", n, f"/{form}")
    x = inputs[rank].clone()
    try:
        if form == "tensor":
            out = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(out, x)
        elif form == "tensor-2d":  # output (world * rows, cols), concatenated on dim 0
            out2 = torch.empty(world * n, 1, dtype=dtype)
            dist.all_gather_into_tensor(out2, x.reshape(n, 1))
            out = out2.reshape(-1)
        elif form == "list":
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, x)
            out = torch.cat(outs)
        elif form == "async":
            out = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(out, x, async_op=True).wait()
        elif form == "single":  # torch 2.13's name for all_gather_into_tensor
            out = torch.empty(n * world, dtype=dtype)
            dist.all_gather_single(out, x)
        else:
            raise ValueError(form)
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather {name}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
        return
    if not torch.equal(_bits(out), _bits(want)):
        bad = (_bits(out) != _bits(want)).nonzero().flatten()
        ck.add(f"all_gather {name}: {bad.numel()} wrong elements, first at {int(bad[0])} "
               f"(from rank {int(bad[0]) // n})", dtype)
    if not torch.equal(_bits(x), _bits(inputs[rank])):
        ck.add(f"all_gather {name}: the input tensor was modified", dtype)
    if digests is not None:
        digests[name] = digest(out)


def _bits(t):
    """Compare as raw bytes, so NaN payloads and -0.0 count."""
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    return t.view(torch.uint8)


def _ag_noncontig(rank, world, ck, seed):
    # tensor form: strided input, strided output
    n = 1031
    inputs = _ag_inputs(seed, world, n, torch.float32)
    in_base = torch.full((3 * n,), -7.0)
    in_base[1::3] = inputs[rank]
    out_base = torch.full((world * n, 2), -9.0)
    try:
        dist.all_gather_into_tensor(out_base[:, 1], in_base[1::3])
        if not torch.equal(out_base[:, 1], torch.cat(inputs)):
            ck.add("all_gather_into_tensor non-contiguous f32: wrong result")
        if not torch.equal(out_base[:, 0], torch.full((world * n,), -9.0)):
            ck.add("all_gather_into_tensor non-contiguous f32: elements outside the output view changed")
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather_into_tensor non-contiguous f32: raised {type(e).__name__}: {str(e)[:300]}")
    # transposed 2-d input (int64), output concatenated on dim 0
    a, b = 7, 11
    inputs = [make_input(seed + 1, r, a * b, torch.int64, "SUM").reshape(b, a).t() for r in range(world)]
    out = torch.empty(world * a, b, dtype=torch.int64)
    try:
        dist.all_gather_into_tensor(out, inputs[rank].clone().t().contiguous().t())
        if not torch.equal(out, torch.cat(inputs)):
            ck.add("all_gather_into_tensor transposed int64 input: wrong result")
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather_into_tensor transposed int64 input: raised {type(e).__name__}: {str(e)[:300]}")
    # list form: strided output views
    n = 4099
    inputs = _ag_inputs(seed + 2, world, n, torch.bfloat16)
    bases = [torch.full((2 * n,), -9.0, dtype=torch.bfloat16) for _ in range(world)]
    try:
        dist.all_gather([bb[1::2] for bb in bases], inputs[rank].clone())
        for r, bb in enumerate(bases):
            if not torch.equal(_bits(bb[1::2]), _bits(inputs[r])):
                ck.add(f"all_gather list form, strided outputs bf16: wrong data from rank {r}")
            if not torch.equal(bb[0::2], torch.full((n,), -9.0, dtype=torch.bfloat16)):
                ck.add(f"all_gather list form, strided outputs bf16: output {r} changed outside its view")
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather list form, strided outputs bf16: raised {type(e).__name__}: {str(e)[:300]}")


def _ag_coalesced(rank, world, ck, seed):
    sizes = [1, 13, 1031, 4]
    for async_ops in (False, True):
        for dtype in (torch.float32, torch.uint8, torch.float64):
            inputs = [_ag_inputs(seed + 10 * k + async_ops, world, n, dtype) for k, n in enumerate(sizes)]
            outs = [torch.empty(n * world, dtype=dtype) for n in sizes]
            label = f"allgather_into_tensor_coalesced {refs.dtype_name(dtype)} sizes {sizes} async={async_ops}"
            try:
                with dist._coalescing_manager(async_ops=async_ops) as cm:
                    for o, ins in zip(outs, inputs):
                        dist.all_gather_into_tensor(o, ins[rank].clone())
                if async_ops:
                    cm.wait()
                for o, ins, n in zip(outs, inputs, sizes):
                    if not torch.equal(o, torch.cat(ins)):
                        ck.add(f"{label}, n={n}: wrong result", dtype)
            except Exception as e:  # noqa: BLE001
                ck.add(f"{label}: raised {type(e).__name__}: {str(e)[:300]}", dtype)
    # allgather_coalesced (the deprecated dist.all_gather_coalesced): list of lists
    inputs = [[make_input(seed + 100 + k, r, n, torch.float32, "SUM") for k, n in enumerate(sizes)]
              for r in range(world)]
    outs = [[torch.empty(n) for n in sizes] for _ in range(world)]
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_gather_coalesced(outs, [t.clone() for t in inputs[rank]])
        for r in range(world):
            for k in range(len(sizes)):
                if not torch.equal(outs[r][k], inputs[r][k]):
                    ck.add(f"all_gather_coalesced f32: tensor {k} from rank {r} is wrong")
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather_coalesced f32: raised {type(e).__name__}: {str(e)[:300]}")


def sec_all_gather(rank, world, cfg):
    ck, digests = Checker(), {}
    seed = cfg.get("seed", 1) * 1000 + 91
    sizes = cfg.get("ag_sizes", AG_SIZES)
    forms = ["tensor", "list", "tensor-2d", "async"] + (["single"] if HAS_SINGLE else [])
    for di, dtype in enumerate(refs.ALL_DTYPES):
        for si, n in enumerate(sizes):
            ag_case(rank, world, seed + di * 100 + si, dtype, n, ck, form=forms[(di + si) % len(forms)],
                    digests=digests)
    for bi, dtype in enumerate(cfg.get("ag_big", [torch.float32])):
        ag_case(rank, world, seed + 9000 + bi, dtype, cfg.get("big_n", BIG), ck, digests=digests)
    # Special floats keep their bits (NaN payloads, -0.0, denormals, infinities).
    special = torch.tensor([-0.0, float("nan"), float("-inf"), 1e-45, -3.5], dtype=torch.float32)
    special = special.view(torch.int32).clone()
    special[1] = 0x7FC0_1234  # a NaN with a payload
    special = special.view(torch.float32)
    out = torch.empty(5 * world)
    try:
        dist.all_gather_into_tensor(out, special if rank == world - 1 else torch.full((5,), float(rank)))
        got = out[5 * (world - 1):]
        if not torch.equal(got.view(torch.int32), special.view(torch.int32)):
            ck.add(f"all_gather special floats: got bits {got.view(torch.int32).tolist()}")
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather special floats: raised {type(e).__name__}: {str(e)[:300]}")
    _ag_noncontig(rank, world, ck, seed + 20000)
    _ag_coalesced(rank, world, ck, seed + 30000)
    # In place, as FSDP2 does: the input is the rank's own block of the output.
    for i, (dtype, n) in enumerate([(torch.float32, 1031), (torch.uint8, 13), (torch.bfloat16, BIG)]):
        inputs = _ag_inputs(seed + 35000 + i, world, n, dtype)
        out = torch.full((n * world,), 3, dtype=dtype)
        out[rank * n:(rank + 1) * n] = inputs[rank]
        try:
            dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
            if not torch.equal(out, torch.cat(inputs)):
                ck.add(f"all_gather in place (input = own block of the output) {refs.dtype_name(dtype)}/n={n}: "
                       "wrong result", dtype)
        except Exception as e:  # noqa: BLE001
            ck.add(f"all_gather in place {refs.dtype_name(dtype)}/n={n}: raised {type(e).__name__}: {str(e)[:300]}",
                   dtype)
    try:
        dist.all_gather_into_tensor(torch.empty(0), torch.empty(0))
        ag_case(rank, world, seed + 40000, torch.float32, 1031, ck)
    except Exception as e:  # noqa: BLE001
        ck.add(f"all_gather of empty tensors: raised {type(e).__name__}: {str(e)[:300]}")
    return ck.result(digests=digests)


# --------------------------------------------------------------------------
# many in flight, mixed with all-reduces

def sec_inflight(rank, world, cfg):
    """64 async ops issued back to back (reduce_scatter, all_gather, all_reduce,
    tensor and list forms, several dtypes and sizes), then waited for in a
    scrambled order: every one must match its reference, so ops were matched
    across ranks in issue order."""
    ck = Checker()
    dts = [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.uint8, torch.int32, torch.float16]
    sizes = [1, 7, 1031, 4099, 65537, 17, 3, 131, 262147]
    pending = []
    for i in range(cfg.get("inflight_ops", 64)):
        dt, n, seed = dts[i % len(dts)], sizes[i % len(sizes)], 70000 + i
        kind = ["rs", "ag", "ar", "rs-list", "ag-list"][i % 5]
        ops = refs.ops_for(dt)
        op = ops[(i // 5) % len(ops)]
        if kind.startswith("rs"):
            ins = [make_input(seed, r, n * world, dt, op) for r in range(world)]
            out = torch.empty(n, dtype=dt)
            if kind == "rs":
                w = dist.reduce_scatter_tensor(out, ins[rank].clone(), op=op_of(op), async_op=True)
            else:
                w = dist.reduce_scatter(out, list(ins[rank].clone().chunk(world)), op=op_of(op), async_op=True)
            pending.append((i, kind, dt, op, n, w, out, ins))
        elif kind.startswith("ag"):
            ins = _ag_inputs(seed, world, n, dt)
            if kind == "ag":
                out = torch.empty(n * world, dtype=dt)
                w = dist.all_gather_into_tensor(out, ins[rank].clone(), async_op=True)
            else:
                out = [torch.empty(n, dtype=dt) for _ in range(world)]
                w = dist.all_gather(out, ins[rank].clone(), async_op=True)
            pending.append((i, kind, dt, op, n, w, out, ins))
        else:
            ins = [make_input(seed, r, n, dt, op) for r in range(world)]
            t = ins[rank].clone()
            w = dist.all_reduce(t, op=op_of(op), async_op=True)
            pending.append((i, kind, dt, op, n, w, t, ins))
    order = list(range(len(pending)))
    order = order[1::2][::-1] + order[0::2]  # odd ones from the back, then even ones
    for j in order:
        i, kind, dt, op, n, w, out, ins = pending[j]
        name = f"in flight #{i} {kind} {_case_name(dt, op, n)}"
        try:
            if i % 3 == 0:
                w.wait(timeout=timedelta(seconds=60))
            else:
                w.wait()
        except Exception as e:  # noqa: BLE001
            ck.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}", dt)
            continue
        if not w.is_completed():
            # gloo's reduce_scatter Work has no future, and its is_completed()
            # stays False after wait() (torch 2.13): native only for "rs".
            ck.add(f"{name}: is_completed() False after wait", dt, native=kind.startswith("rs"))
        if kind.startswith("rs"):
            err = compare(out, [_chunk(x, rank, n) for x in ins], _chunk(reference(ins, dt, op), rank, n), dt, op)
        elif kind.startswith("ag"):
            got = out if kind == "ag" else torch.cat(out)
            err = None if torch.equal(got, torch.cat(ins)) else "wrong result"
        else:
            err = compare(out, ins, reference(ins, dt, op), dt, op)
        if err:
            ck.add(f"{name}: {err}", dt)
    # An all-gather whose future callback issues a reduce-scatter of the gathered
    # data (FSDP-like chaining), with all-reduces queued behind it.
    n = 4099
    ins = _ag_inputs(123, world, n, torch.float32)
    gathered = torch.empty(n * world)
    head = dist.all_gather_into_tensor(gathered, ins[rank].clone(), async_op=True)
    behind = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(3)]
    out = torch.empty(n)
    chained = head.get_future().then(lambda f: dist.reduce_scatter_tensor(out, gathered) or True)
    try:
        chained.wait()
        for w in behind:
            w.wait()
        # every rank reduced the same gathered tensor: world x its chunk `rank`
        want = torch.cat(ins)[rank * n:(rank + 1) * n] * world
        if not torch.equal(out, want):
            ck.add("reduce_scatter inside an all_gather's future callback: wrong result")
    except Exception as e:  # noqa: BLE001
        ck.add(f"reduce_scatter inside an all_gather's future callback: raised {type(e).__name__}: {str(e)[:300]}")
    # A reduce-scatter's Work has a future (native only: gloo's reduce_scatter
    # Work raises "Work::getFuture not implemented").
    try:
        o = torch.empty(n)
        v = dist.reduce_scatter_tensor(o, torch.ones(n * world), async_op=True).get_future().wait()
        if not torch.equal(o, torch.full((n,), float(world))):
            ck.add(f"reduce_scatter_tensor(async_op=True).get_future(): wrong result {o[:4].tolist()}", native=True)
        if not isinstance(v, list) or not any(isinstance(t, torch.Tensor) and t.data_ptr() == o.data_ptr() for t in v):
            ck.add(f"reduce_scatter_tensor(async_op=True).get_future().wait() is {v!r:.100}, "
                   "expected a list holding the output", native=True)
    except Exception as e:  # noqa: BLE001
        ck.add(f"reduce_scatter_tensor(async_op=True).get_future(): raised {type(e).__name__}: {str(e)[:300]}",
               native=True)
    # all_reduce still right afterwards
    f = Failures()
    _run_case(rank, world, 31338, torch.float32, "SUM", 65537, f, None)
    for m in f:
        ck.add(f"all_reduce after the in-flight mix: {m}")
    return ck.result()


# --------------------------------------------------------------------------
# which path ran: native or delegated (dump_recent kinds)

def sec_native(rank, world, cfg):
    """Each call's records in dump_recent: equal-size forms must be Fairring's own
    ("reduce_scatter" / "all_gather"), the uneven lists too (all_gather's as
    blocks of unequal sizes, reduce_scatter's unpadded).  Every
    finding of the native forms goes to native_only (they are delegated until
    issue 9's C++ lands); a wrong kind for the uneven ones is a failure."""
    ck = Checker()
    kinds_seen = {}
    n = 1031

    def expect(label, fn, want_native, kind):
        seq = _last_seq()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            ck.add(f"{label}: raised {type(e).__name__}: {str(e)[:300]}", native=want_native)
            return
        kinds = _kinds_since(seq)
        kinds_seen[label] = kinds
        if not kinds:
            ck.add(f"{label}: no record in dump_recent", native=want_native)
        elif want_native and any(k != kind for k in kinds):
            ck.add(f"{label}: ran as {kinds}, expected native {kind!r}", native=True)
        elif not want_native and not all(k.endswith("(gloo)") for k in kinds):
            ck.add(f"{label}: ran as {kinds}, expected delegated to gloo")

    x = torch.ones(n * world)
    big = torch.ones(BIG * world)
    cases = [
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(n), x), True, NATIVE_RS),
        ("reduce_scatter_tensor 1 MiB+", lambda: dist.reduce_scatter_tensor(torch.empty(BIG), big), True, NATIVE_RS),
        ("reduce_scatter_tensor int8 MIN", lambda: dist.reduce_scatter_tensor(
            torch.empty(13, dtype=torch.int8), torch.ones(13 * world, dtype=torch.int8), op=dist.ReduceOp.MIN),
         True, NATIVE_RS),
        ("reduce_scatter_tensor AVG async", lambda: dist.reduce_scatter_tensor(
            torch.empty(n), x, op=dist.ReduceOp.AVG, async_op=True).wait(), True, NATIVE_RS),
        *([("reduce_scatter_single", lambda: dist.reduce_scatter_single(torch.empty(n), x), True, NATIVE_RS),
           ("all_gather_single", lambda: dist.all_gather_single(torch.empty(n * world), torch.ones(n)), True,
            NATIVE_AG)] if HAS_SINGLE else []),
        ("reduce_scatter list, equal sizes", lambda: dist.reduce_scatter(
            torch.empty(n), [torch.ones(n) for _ in range(world)]), True, NATIVE_RS),
        ("reduce_scatter non-contiguous", lambda: dist.reduce_scatter_tensor(
            torch.empty(2 * n)[::2], torch.ones(2 * n * world)[::2]), True, NATIVE_RS),
        ("reduce_scatter_tensor_coalesced", lambda: _coalesced_rs(world), True, NATIVE_RS),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(n * world), torch.ones(n)),
         True, NATIVE_AG),
        ("all_gather_into_tensor 1 MiB+", lambda: dist.all_gather_into_tensor(torch.empty(BIG * world),
                                                                             torch.ones(BIG)), True, NATIVE_AG),
        ("all_gather_into_tensor bool async", lambda: dist.all_gather_into_tensor(
            torch.empty(13 * world, dtype=torch.bool), torch.ones(13, dtype=torch.bool), async_op=True).wait(),
         True, NATIVE_AG),
        ("all_gather list, equal sizes", lambda: dist.all_gather([torch.empty(n) for _ in range(world)],
                                                                 torch.ones(n)), True, NATIVE_AG),
        ("all_gather non-contiguous", lambda: dist.all_gather_into_tensor(
            torch.empty(2 * n * world)[::2], torch.ones(2 * n)[::2]), True, NATIVE_AG),
        ("allgather_into_tensor_coalesced", lambda: _coalesced_ag(world), True, NATIVE_AG),
        ("all_gather_into_tensor in place", lambda: _in_place_ag(rank, world), True, NATIVE_AG),
        ("reduce_scatter_tensor in place", lambda: _in_place_rs(rank, world), True, NATIVE_RS),
        ("allgather_coalesced", lambda: _all_gather_coalesced(world), True, NATIVE_AG),
        # Uneven list forms: all_gather of unequal blocks, reduce_scatter's unpadded.
        ("all_gather list, uneven sizes", lambda: _uneven_ag(rank, world), True, "all_gatherv"),
        ("reduce_scatter list, uneven sizes", lambda: _uneven_rs(rank, world, ck), True, NATIVE_RS),
        ("reduce_scatter list, uneven strided", lambda: _uneven_rs(rank, world, ck, strided=True), True,
         NATIVE_RS),
    ]
    for label, fn, want_native, kind in cases:
        expect(label, fn, want_native, kind)
    return ck.result(kinds=kinds_seen)


def _in_place_ag(rank, world):
    out = torch.zeros(1031 * world)
    dist.all_gather_into_tensor(out, out[rank * 1031:(rank + 1) * 1031])


def _in_place_rs(rank, world):
    buf = torch.ones(1031 * world)
    dist.reduce_scatter_tensor(buf[rank * 1031:(rank + 1) * 1031], buf)


def _coalesced_rs(world):
    with dist._coalescing_manager():
        for n in (13, 1031):
            dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * world))


def _coalesced_ag(world):
    with dist._coalescing_manager():
        for n in (13, 1031):
            dist.all_gather_into_tensor(torch.empty(n * world), torch.ones(n))


def _all_gather_coalesced(world):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_gather_coalesced([[torch.empty(3), torch.empty(5)] for _ in range(world)],
                                  [torch.ones(3), torch.ones(5)])


def _uneven_ag(rank, world):
    # Rank r contributes r + 1 elements (gloo refuses this form).
    outs = [torch.empty(r + 1) for r in range(world)]
    dist.all_gather(outs, torch.full((rank + 1,), float(rank)))
    for r, o in enumerate(outs):
        if not torch.equal(o, torch.full((r + 1,), float(r))):
            raise AssertionError(f"uneven all_gather: from rank {r} got {o.tolist()}")


def _uneven_rs(rank, world, ck, strided=False):
    # Rank j's output has j + 1 elements.
    inputs = [torch.full((j + 1,), float(rank + 1)) for j in range(world)]
    if strided:
        inputs = [torch.full((2 * (j + 1),), float(rank + 1))[::2] for j in range(world)]
    out = torch.empty(rank + 1)
    dist.reduce_scatter(out, inputs)
    want = torch.full((rank + 1,), float(world * (world + 1) // 2))
    if not torch.equal(out, want):
        raise AssertionError(f"uneven reduce_scatter: got {out.tolist()}, want {want.tolist()}")
    # Each block as long as it is: the op reads the list's bytes, not W
    # blocks of the largest (padding).
    import fairring_py
    last = fairring_py.dump_recent(file=io.StringIO())[-1]
    if last["bytes"] != 4 * world * (world + 1) // 2:
        raise AssertionError(f"uneven reduce_scatter of {world * (world + 1) // 2} float32 moved {last['bytes']} "
                             f"bytes (padded to the largest block?)")


# --------------------------------------------------------------------------
# mismatches between ranks (a launch of their own: see the module docstring)

MISMATCHES = ["rs_size", "rs_dtype", "rs_op", "ag_size", "ag_dtype", "rs_vs_ag", "rs_vs_allreduce", "rs_uneven_cut"]


def _mismatch_call(which, rank, world, g):
    other = rank == world - 1  # the odd one out
    if which == "rs_size":
        n = 11 if other else 10
        dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * world), group=g)
    elif which == "rs_dtype":
        dt = torch.float64 if other else torch.float32
        dist.reduce_scatter_tensor(torch.empty(10, dtype=dt), torch.ones(10 * world, dtype=dt), group=g)
    elif which == "rs_op":
        op = dist.ReduceOp.MAX if other else dist.ReduceOp.SUM
        dist.reduce_scatter_tensor(torch.empty(1000), torch.ones(1000 * world), op=op, group=g)
    elif which == "ag_size":
        n = 1031 if other else 1030
        dist.all_gather_into_tensor(torch.empty(n * world), torch.ones(n), group=g)
    elif which == "ag_dtype":
        dt = torch.int32 if other else torch.float32
        dist.all_gather_into_tensor(torch.empty(100 * world, dtype=dt), torch.ones(100, dtype=dt), group=g)
    elif which == "rs_vs_ag":
        if other:
            dist.all_gather_into_tensor(torch.empty(100 * world), torch.ones(100), group=g)
        else:
            dist.reduce_scatter_tensor(torch.empty(100), torch.ones(100 * world), group=g)
    elif which == "rs_uneven_cut":
        # The same total and largest block, cut differently: rank 0's first two
        # blocks are 2 and 3 elements, the odd one's 3 and 2 (each rank's own
        # output fits its own list).  Summed as they are, rank 0's two
        # elements would be added to the odd one's first two of three.
        sizes = [3, 2] if other else [2, 3]
        sizes += [3] * (world - 2)
        dist.reduce_scatter(torch.empty(sizes[rank]), [torch.ones(n) for n in sizes], group=g)
    elif which == "rs_vs_allreduce":
        if other:
            dist.all_reduce(torch.ones(100 * world), group=g)
        else:
            dist.reduce_scatter_tensor(torch.empty(100), torch.ones(100 * world), group=g)
    else:
        raise ValueError(which)


def mismatch_session(rank, world, cases, timeout_s):
    """Each case on a fresh Fairring group (a failed group stays failed): the
    mismatched call must raise a RuntimeError that says "mismatch" on every rank,
    well before the group's timeout.  Returns {case: {"error": str|None, "s": t}}."""
    out = {}
    sync = dist.new_group(list(range(world)), backend="gloo")
    for which in cases:
        g = dist.new_group(list(range(world)), backend="fairring", timeout=datetime.timedelta(seconds=timeout_s))
        dist.all_reduce(torch.ones(1), group=g)
        dist.barrier(group=sync)  # the warm-up is over everywhere before the mismatch
        t0 = time.monotonic()
        try:
            _mismatch_call(which, rank, world, g)
            err, runtime = None, False
        except Exception as e:  # noqa: BLE001
            err, runtime = f"{type(e).__name__}: {str(e)[:400]}", isinstance(e, RuntimeError)
        out[which] = {"error": err, "runtime": runtime, "s": round(time.monotonic() - t0, 2)}
        dist.barrier(group=sync)
    return out


# --------------------------------------------------------------------------

SECTIONS = {
    "reduce_scatter": sec_reduce_scatter,
    "all_gather": sec_all_gather,
    "inflight": sec_inflight,
    "native": sec_native,
}


def session(rank, world, sections, cfg):
    return run_sections(SECTIONS, rank, world, sections, cfg, native_only=[])
