"""FSDP2, FSDP1 and ZeroRedundancyOptimizer end to end on 2 ranks (1x2 and
2x1): a few training steps over the Fairring group match the same steps over a
gloo group (losses and parameters to 1e-5 relative).  test_native_sharded_*
checks that the Fairring group ran FSDP's collectives natively (it failed while
they were delegated to gloo, before bc0910e)."""
from __future__ import annotations

import pytest

import launch
import rank_sharded

VARIANTS = ["fsdp2", "fsdp1", "zero"]
TOPOLOGIES = ["1x2", "2x1"]
RTOL = 1e-5


def results(topo):
    return [r.value for r in launch.on(topo, rank_sharded.session, args=(VARIANTS,), timeout_s=240)]


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_sharded_training_matches_gloo(topo, variant):
    per_rank = [v[variant] for v in results(topo)]
    for r, v in enumerate(per_rank):
        assert "error" not in v, f"{topo} {variant} rank {r}: {v['error']}"
        assert v["finite"], f"{topo} {variant} rank {r}: non-finite parameters"
        assert v["loss_rel"] <= RTOL, (f"{topo} {variant} rank {r}: losses differ by {v['loss_rel']:.2e} relative: "
                                       f"fairring {v['losses_fairring']} gloo {v['losses_gloo']}")
        assert v["param_rel"] <= RTOL, f"{topo} {variant} rank {r}: parameters differ by {v['param_rel']:.2e} relative"
        assert v["changed"] is None or v["changed"] > 1e-4, f"{topo} {variant} rank {r}: training changed nothing"
    if variant == "zero":  # every rank holds the whole model: the same on all ranks
        assert all(v["full_params"] == per_rank[0]["full_params"] for v in per_rank), (
            f"{topo}: ZeRO parameters differ between ranks")


NATIVE_KINDS = {"reduce_scatter", "all_gather", "all_reduce", "broadcast", "barrier"}


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("variant", ["fsdp2", "fsdp1"])
def test_native_sharded_collectives(topo, variant):
    """FSDP's all-gathers and reduce-scatters on the Fairring group ran natively
    (dump_recent kinds of its last 64 collectives)."""
    for r, v in enumerate(results(topo)):
        kinds = v[variant].get("kinds", {})
        assert kinds, f"{topo} {variant} rank {r}: no collectives recorded"
        delegated = {k: n for k, n in kinds.items() if k not in NATIVE_KINDS}
        assert not delegated, f"{topo} {variant} rank {r}: delegated to gloo: {delegated} (all: {kinds})"
