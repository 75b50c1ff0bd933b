"""Fresh output memory (kernels/first_touch.h, docs/USER_GUIDE.md "Fresh
output buffers"): the huge-page advice changes no byte, skips warm memory,
and every native collective gives the reference's results into fresh,
reused, unaligned and huge-page-backed memory, with the advice on and off."""
from __future__ import annotations

import pytest
import torch

import launch
import rank_fresh
from fairring_py import _C
from topologies import params

HUGE = 2 << 20
madvise_mode = pytest.mark.skipif(_C._thp_mode() != "madvise",
                                  reason=f"transparent huge pages are {_C._thp_mode()!r}, not 'madvise'")


@madvise_mode
def test_fresh_memory_gets_its_aligned_interior_advised():
    t = torch.empty(50 << 20, dtype=torch.uint8)
    begin = t.data_ptr()
    first = -(-begin // HUGE) * HUGE
    last = (begin + t.numel()) // HUGE * HUGE
    assert _C._advise_fresh_memory_for_test(t) == last - first


@madvise_mode
def test_warm_memory_is_left_alone_and_advice_changes_no_byte():
    t = torch.arange(12 << 20, dtype=torch.int32)  # written: resident
    before = t.clone()
    assert _C._advise_fresh_memory_for_test(t) == 0
    fresh = torch.empty(12 << 20, dtype=torch.int32)
    assert _C._advise_fresh_memory_for_test(fresh) > 0
    fresh.copy_(before)
    assert torch.equal(t, before) and torch.equal(fresh, before)


def test_small_ranges_are_not_advised():
    assert _C._advise_fresh_memory_for_test(torch.empty(1 << 20, dtype=torch.uint8)) == 0


@pytest.mark.parametrize("advice", ["advise", "off"])
@pytest.mark.parametrize("nodes", params("1x2", "2x2"))
def test_every_collective_into_fresh_reused_unaligned_and_huge_page_memory(nodes, advice):
    res = launch.run_ranks(rank_fresh.fresh_outputs, nodes, args=(11,), env={"FAIRRING_HUGE_PAGES": advice},
                           timeout_s=240, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])


def test_the_option_takes_advise_or_off():
    from fairring_py.options import Options, resolve

    assert resolve(environ={}).huge_pages == "advise"
    assert resolve(environ={"FAIRRING_HUGE_PAGES": " OFF "}).huge_pages == "off"
    assert resolve(Options(huge_pages="advise"), environ={"FAIRRING_HUGE_PAGES": "off"}).huge_pages == "advise"
    with pytest.raises(ValueError, match="FAIRRING_HUGE_PAGES must be one of advise, off"):
        resolve(environ={"FAIRRING_HUGE_PAGES": "always"})
