"""All-reduce correctness per simulated topology, plus the features that need a
live multi-node job (async ops, DDP, subgroups, delegated collectives, shared
memory hygiene, listener security).

Each topology is launched ONCE (process start costs seconds); the launch runs
all its checks in one process group and the tests below assert on the cached
per-section results.
"""
from __future__ import annotations

import re

import pytest
import torch

import launch
import rank_all_reduce
import topologies

BASE = ["correctness", "noncontig", "shm", "listen"]
FEATURES = ["async", "ddp", "subgroups", "collectives", "unsupported", "intruder", "empty", "late_peer",
            "broadcast"]
FEW_SIZES = [1, 13, 1031, 4099, 65537]

# name in tests/topologies.py -> (sections, cfg)
TOPOLOGIES = {
    "1x2": (BASE + ["unsupported", "empty", "late_peer", "broadcast"], {}),
    "2x1": (BASE + ["broadcast", "half_range"], {}),
    "3x1-options": (BASE, {"sizes": FEW_SIZES}),
    "2x2": (BASE + FEATURES + ["half_range"], {"big": [(torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int32, "MAX")]}),
    "uneven-2+1": (BASE + ["broadcast", "half_range"], {"sizes": FEW_SIZES}),
    # Rank 4 is passive (and a root).
    "uneven-3+2": (BASE + ["broadcast", "half_range"], {"sizes": FEW_SIZES}),
    "noncontig-map-abab": (BASE, {"sizes": FEW_SIZES}),
    "2x2-slice4K": (BASE, {"sizes": FEW_SIZES + [262147]}),
    "4x1-paced": (BASE, {"sizes": FEW_SIZES}),
    "4x1-radix2": (BASE + ["half_range"], {"sizes": FEW_SIZES + [262147]}),
    "6x1-radix2": (BASE, {"sizes": FEW_SIZES + [262147]}),
    "4x2-radix2": (BASE + ["half_range"], {"sizes": FEW_SIZES}),
    # The device-like host mover: a missing wait shows up as wrong numbers here.
    "1x3-deferred": (BASE, {"sizes": FEW_SIZES}),  # 65537 elements: 64 slices of 4 KiB
    # Several slices in flight: 262147 elements (2 slices) for every dtype and op,
    # and the "big" case (3 M float32 elements, 12 slices).
    "2x2-deferred": (BASE + ["half_range"], {"sizes": FEW_SIZES + [262147]}),
    # Uneven nodes under the device-like mover: a carrier's wait for its passive
    # ranks' pieces, and their reads of its chunk (test_reduce_scatter_all_gather.py).
    "uneven-2+1-deferred": (BASE + ["half_range"], {"sizes": FEW_SIZES}),
    # One rank per node: no node peers, so no peer events (the CUDA mover has none).
    "2x1-deferred": (BASE + ["broadcast"], {"sizes": FEW_SIZES + [262147]}),
}


def launch_on(name, fn, sections, cfg):
    """fn(rank, world, sections, cfg) on topology `name`, with the Options
    of rank_all_reduce.options_by_rank where the topology takes its node ids
    from them; cfg gets the smallest node's rank count."""
    t = topologies.get(name)
    nodes = t.layout
    return launch.run_ranks(fn, list(t.ids), args=(sections, dict(cfg, local_ranks=min(nodes.count(n) for n in nodes))),
                            env=dict(t.env), timeout_s=240, pg_timeout_s=60,
                            pg_options_fn=rank_all_reduce.options_by_rank if t.options else None, check=False)


def session(name):
    """The results of topology `name`'s one launch, and /dev/shm's fairring
    files before and after it."""
    def run():
        before = launch.list_shm()
        res = launch_on(name, rank_all_reduce.session, *TOPOLOGIES[name])
        return res, before, launch.list_shm()
    return launch.once(("test_all_reduce", name), run)


def section(name, sec):
    res, _, _ = session(name)
    bad = [r for r in res if not r.ok]
    if bad:
        raise AssertionError(f"topology {name}: ranks {[r.rank for r in bad]} did not return:\n"
                             + launch.describe_all(res))
    return [r.value[sec] for r in res], res


def _fail_report(name, sec, per_rank):
    lines = []
    for r, v in enumerate(per_rank):
        for f in v["failures"]:
            lines.append(f"[{name} rank {r}] {f}")
    return f"{sec} failures on topology {name}:\n" + "\n".join(lines[:80])


def assert_no_failures(name, sec):
    per_rank, _ = section(name, sec)
    assert not any(v["failures"] for v in per_rank), _fail_report(name, sec, per_rank)
    return per_rank


def assert_same_bits(topo, per_rank, at_least, what="result"):
    """Every rank's result digests are rank 0's (and there are enough of them)."""
    d0 = per_rank[0]["digests"]
    assert len(d0) > at_least
    for r, v in enumerate(per_rank[1:], 1):
        diff = [k for k in d0 if v["digests"].get(k) != d0[k]]
        assert not diff, f"{topo}: {what} bits on rank {r} differ from rank 0's for {diff[:20]}"


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_correctness(topo):
    assert_same_bits(topo, assert_no_failures(topo, "correctness"), 100)


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_noncontiguous(topo):
    per_rank = assert_no_failures(topo, "noncontig")
    for r, v in enumerate(per_rank[1:], 1):
        assert v["digests"] == per_rank[0]["digests"], f"{topo}: non-contiguous results differ between rank 0 and {r}"


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_shared_memory_hygiene(topo):
    per_rank = assert_no_failures(topo, "shm")
    res, before, after = session(topo)
    names = {n for v in per_rank for n in v["names"]}
    leftover = [n for n in names if n in after]
    assert not leftover, f"{topo}: segments mapped by the job still in /dev/shm after it ended: {leftover}"
    new = sorted(launch.shm_left_behind(after - before))
    assert not new, f"{topo}: fairring-* files appeared in /dev/shm during the job and remain: {new}"


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_listen_address(topo):
    per_rank = assert_no_failures(topo, "listen")
    nodes = topologies.get(topo).layout
    addrs = [v["addr"] for v in per_rank]
    if len(set(nodes)) == 1:
        assert addrs == [""] * len(nodes), f"{topo}: single-node job must have listen_address() == '': {addrs}"
    else:
        # A rank past the smallest node's count carries no rail (uneven nodes):
        # nothing of it listens.
        passive = [t is not None and t["local_rank"] >= t["rails"] for t in (v["topology"] for v in per_rank)]
        for r, a in enumerate(addrs):
            if passive[r]:
                assert a == "", f"{topo}: rank {r} carries no rail, yet listen_address() is {a!r}"
                continue
            assert isinstance(a, str) and re.fullmatch(r"\[?[0-9a-fA-F.:]+\]?:\d+", a), (
                f"{topo}: rank {r} listen_address() is {a!r}, expected 'ip:port'")
            assert 0 < int(a.rpartition(":")[2]) < 65536
        on_rail = [a for r, a in enumerate(addrs) if not passive[r]]
        assert len(set(on_rail)) == len(on_rail), f"{topo}: listen addresses are not distinct: {addrs}"


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_clean_exit(topo):
    """Every rank exits with code 0 soon after its work (destroy_process_group
    and interpreter shutdown must not hang)."""
    res, _, _ = session(topo)
    bad = [r for r in res if r.exitcode != 0 or r.hung_at_exit]
    assert not bad, f"{topo}: ranks did not exit cleanly:\n" + launch.describe_all(bad)


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_node_layout_detected(topo):
    """FAIRRING_NODE_ID / Options.node_id decide the layout (checked through the
    backend's topology() introspection when it has one)."""
    per_rank = assert_no_failures(topo, "listen")
    nodes = topologies.get(topo).layout
    distinct = list(dict.fromkeys(nodes))
    counts = [nodes.count(n) for n in distinct]
    topos = [v["topology"] for v in per_rank]
    if topos[0] is None:
        pytest.skip("backend has no topology() introspection")
    for r, t in enumerate(topos):
        assert t["rank"] == r and t["size"] == len(nodes), t
        # Every layout keeps its nodes (uneven ones too: one rail per rank
        # of the smallest node, the other ranks passive).
        assert not t["flattened"], f"{topo}: layout flattened: {t}"
        assert t["uneven"] == (len(set(counts)) > 1), f"{topo}: {t}"
        assert t["num_nodes"] == len(distinct) and t["rails"] == min(counts), f"{topo}: {t}"
        assert t["ranks_per_node"] == nodes.count(nodes[r]), f"{topo}: {t}"
        assert sorted(map(sorted, t["node_ranks"])) == sorted(
            sorted(i for i, m in enumerate(nodes) if m == n) for n in distinct), f"{topo}: {t}"


_WARN_RE = re.compile(r"Warning: (.*)")


def _layout_warnings(output):
    """Warnings (Python UserWarning or c10 TORCH_WARN lines) about the node layout."""
    out = []
    for m in _WARN_RE.finditer(output):
        msg = m.group(1).lower()
        if "node" in msg and "rank" in msg:
            out.append(m.group(1))
    return out


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_topology_warning(topo):
    """Uneven nodes log one warning (at most one per process); even layouts none."""
    res, _, _ = session(topo)
    warns = [_layout_warnings(r.output) for r in res]
    nodes = topologies.get(topo).layout
    counts = {n: nodes.count(n) for n in nodes}
    assert all(len(w) <= 1 for w in warns), f"{topo}: layout warning repeated within a process: {warns}"
    if len(set(counts.values())) > 1:
        assert sum(len(w) for w in warns) >= 1, (
            f"{topo}: uneven node sizes {counts} but no warning about it in any rank's output")
        # It names every node (its key: "id:" and the node id) with its count of ranks.
        text = " ".join(sum(warns, []))
        for node, n in counts.items():
            assert f"'id:{node}': {n}" in text, f"{topo}: {counts} not all in the warning: {text}"
    elif "subgroups" in TOPOLOGIES[topo][0]:
        # the subgroup [1, 2, 3] is uneven and may warn; rank 0 is not in it
        assert not warns[0], f"{topo}: unexpected layout warning on rank 0 of an even topology: {warns[0]}"
    else:
        assert not any(warns), f"{topo}: unexpected layout warning on an even topology: {warns}"


def test_unsupported_ops_raise():
    for topo in ("1x2", "2x2"):
        assert_no_failures(topo, "unsupported")


@pytest.mark.parametrize("topo", [t for t, (sections, _) in TOPOLOGIES.items() if "half_range" in sections])
def test_half_precision_avg_near_its_largest_value(topo):
    """float16 AVG whose sums pass float16's largest value: a node's sum is
    divided before it is stored (reduce_op.h), on even and uneven nodes,
    one rank a node, and rails in levels; and of inputs just above float16's
    smallest normal, within the rounding each of those paths allows (one
    unit of 2^-24 on equal nodes, where dividing by the world would give two
    at 4 x 2)."""
    assert_no_failures(topo, "half_range")


def test_empty_tensor():
    for topo in ("1x2", "2x2"):
        assert_no_failures(topo, "empty")


def test_small_op_does_not_wait_for_late_peer():
    for topo in ("1x2", "2x2"):
        assert_no_failures(topo, "late_peer")


def test_async_many_in_flight():
    assert_no_failures("2x2", "async")


def test_ddp_matches_gloo():
    per_rank = assert_no_failures("2x2", "ddp")
    digs = {v["digest"] for v in per_rank}
    assert len(digs) == 1, f"DDP parameters differ across ranks: {[v['digest'] for v in per_rank]}"


def test_subgroups():
    assert_no_failures("2x2", "subgroups")


@pytest.mark.parametrize("topo", ["1x2", "2x1", "2x2"])
def test_broadcast(topo):
    assert_no_failures(topo, "broadcast")


def test_delegated_collectives():
    assert_no_failures("2x2", "collectives")


def test_intruder_rejected():
    per_rank = assert_no_failures("2x2", "intruder")
    for r, v in enumerate(per_rank):
        kind, secs, _ = v["results"]["garbage"]
        assert kind in ("eof", "reset") and secs < 5, f"rank {r}: intruder connection outcome {kind} after {secs:.1f}s"
