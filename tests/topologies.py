"""Every simulated cluster the tests launch, by name: FAIRRING_NODE_ID per rank
and the extra environment.  Test files parametrise over these names and keep
only what is their own (sections, sizes) in tables keyed by them, so a name
means one layout everywhere and pytest ids name the cluster.

Names: NxM is N nodes of M ranks; uneven-A+B nodes of A and B ranks (interleaved
where the ids say so); -slice4K many 4 KiB slices per op in little memory;
-deferred the device-like host mover (csrc/devices/deferred_mover.h: every
step later on a per-slot stream, ordered only by the events the schedule asks
for, as on CUDA)."""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

SLICE4K = {"FAIRRING_SLICE_SIZE": "4K", "FAIRRING_PARALLELISM": "2", "FAIRRING_TOTAL_MEMORY": "1M"}
DEFERRED = {"FAIRRING_TEST_DEFERRED_MOVER": "1"}


@dataclasses.dataclass(frozen=True, eq=False)
class Topology:
    ids: Tuple[Optional[str], ...]  # FAIRRING_NODE_ID per rank (None: unset)
    env: Mapping[str, str]  # extra environment of every rank (read-only)
    # Node ids come from Options(node_id=...) (rank_all_reduce.options_by_rank), not the environment.
    options: bool = False

    @property
    def world(self) -> int:
        return len(self.ids)

    @property
    def layout(self) -> list:
        """The node each rank ends up on (what the backend sees)."""
        if self.options:
            return [f"opt-node-{r}" for r in range(self.world)]
        return list(self.ids)


def _t(ids, env=None, options=False) -> Topology:
    return Topology(tuple(ids), MappingProxyType(dict(env or {})), options)


TOPOLOGIES = {
    "1x1": _t("a"),
    "1x2": _t("aa"),
    "1x3": _t("aaa"),
    "2x1": _t("ab"),
    "2x2": _t("aabb"),
    "3x1": _t("abc"),
    "4x1": _t("abcd"),
    "3x2": _t("aabbcc"),
    # Three nodes of one rank each, the ids given through Options.
    "3x1-options": _t([None] * 3, options=True),
    "uneven-2+1": _t("aab"),
    "uneven-1+2": _t("abb"),
    # Interleaved nodes of 2 and 1: rank 1 alone on its node between rank 0's and rank 2's.
    "uneven-2+1-aba": _t("aba"),
    "uneven-2+1+1": _t("aabc"),
    # Interleaved nodes of 3 and 2 ranks: two rails, rank 4 passive.
    "uneven-3+2": _t("ababa"),
    # Two nodes of three and one of one: one rail, eight landings for seven ranks,
    # many slices in flight.
    "uneven-3+3+1-slice4K": _t("abababc", SLICE4K),
    # 2x2 with the nodes interleaved: the rank-to-node map is not contiguous.
    "noncontig-map-abab": _t("abab"),
    "2x2-slice4K": _t("aabb", SLICE4K),
    "1x3-deferred": _t("aaa", {**DEFERRED, **SLICE4K}),
    "2x1-deferred": _t("ab", DEFERRED),
    "2x2-deferred": _t("aabb", DEFERRED),
    "uneven-2+1-deferred": _t("aab", {**DEFERRED, **SLICE4K}),
    # A node of one beside a node of three: one rail carrying two passive ranks'
    # pieces, many slices in flight.
    "uneven-1+3-deferred": _t("abbb", {**DEFERRED, **SLICE4K}),
    # Rail rounds paced one node ahead of their receives (RailStage::hold),
    # with many slices in flight holding sends for the same peers.
    "4x1-paced": _t("abcd", {**SLICE4K, "FAIRRING_RAIL_SEND_WINDOW": "1"}),
    # The all-reduce's rail in levels (plan/rail_levels.h: chunks of 8 to 32
    # KiB per node; small slices so that most sizes have them): halving-
    # doubling on 4 nodes with many slices in flight; levels of 3 and 2
    # nodes; levels of 2 on two rails of 2 ranks.
    "4x1-radix2": _t("abcd", {"FAIRRING_SLICE_SIZE": "64K", "FAIRRING_PARALLELISM": "2",
                              "FAIRRING_RAIL_RADIX": "2"}),
    "6x1-radix2": _t("abcdef", {"FAIRRING_SLICE_SIZE": "128K", "FAIRRING_RAIL_RADIX": "2"}),
    "4x2-radix2": _t("aabbccdd", {"FAIRRING_SLICE_SIZE": "128K", "FAIRRING_RAIL_RADIX": "2"}),
}

# The clusters every host collective (all-to-all, gather / scatter, reduce)
# is checked on.
SWEEP = ("1x1", "1x2", "1x3", "2x1", "2x2", "3x1", "uneven-2+1", "uneven-3+2", "2x2-slice4K", "2x2-deferred",
         "uneven-1+3-deferred", "4x1-paced")


def get(name: str) -> Topology:
    return TOPOLOGIES[name]


def node_ids(name: str) -> list:
    """FAIRRING_NODE_ID per rank of `name` (a fresh list)."""
    return list(TOPOLOGIES[name].ids)


def env(name: str) -> dict:
    """The extra environment of `name` (a fresh dict)."""
    return dict(TOPOLOGIES[name].env)


def params(*names: str) -> list:
    """pytest parameters: each name's node ids, the name as the test id."""
    import pytest

    return [pytest.param(node_ids(n), id=n) for n in names]
