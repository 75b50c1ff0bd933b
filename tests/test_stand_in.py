"""The block cache behind Fairring's own stand-in tensors (backend/stand_in.h):
large CPU blocks come back for the next op instead of fresh pages; small ones
and the cache's limit leave memory to the allocator."""
import torch

import fairring_py._C as C

MIB = 1 << 20


def test_large_blocks_are_reused_and_small_ones_are_not_cached():
    before = C._stand_in_cached_bytes_for_test()
    like = torch.empty(0)
    t = C._stand_in_for_test(3 * MIB // 4 + 5, like)  # 3 MiB and a bit of float32
    assert t.dtype == torch.float32 and t.numel() == 3 * MIB // 4 + 5 and t.is_contiguous()
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * t.numel()
    addr = t.data_ptr()
    assert addr % (2 * MIB) == 0  # huge-page aligned blocks
    del t
    held = C._stand_in_cached_bytes_for_test()
    assert held >= before + 3 * MIB
    # A nearby size takes the same block back.
    u = C._stand_in_for_test(3 * MIB // 4, like)
    assert u.data_ptr() == addr
    assert C._stand_in_cached_bytes_for_test() < held
    del u
    small = C._stand_in_for_test(1000, like)
    assert small.numel() == 1000
    cached = C._stand_in_cached_bytes_for_test()
    del small
    assert C._stand_in_cached_bytes_for_test() == cached


def test_cache_stays_within_its_limit_and_dtypes_size_right():
    blocks = [C._stand_in_for_test(40 * MIB // 8, torch.empty(0, dtype=torch.float64)) for _ in range(10)]
    assert all(b.dtype == torch.float64 and b.numel() == 40 * MIB // 8 for b in blocks)
    assert len({b.data_ptr() for b in blocks}) == 10  # live blocks are never shared
    del blocks
    assert C._stand_in_cached_bytes_for_test() <= 256 * MIB
    c = C._stand_in_for_test(MIB, torch.empty(0, dtype=torch.complex64))
    assert c.dtype == torch.complex64 and c.numel() == MIB and c.nbytes == 8 * MIB
