"""The point-to-point matching rule (p2p/matcher.h), pure: a message goes to
the oldest posted receive naming its source (or any) and its tag; a receive
takes the oldest kept message that fits; cancelled receives match nothing."""
from __future__ import annotations

import fairring_py._C as C


def run(*events):
    return C._matcher_for_test(list(events))


def test_message_goes_to_the_oldest_fitting_receive():
    # receives 1 (from 0, tag 5), 2 (any, tag 5), 3 (from 1, tag 5)
    got = run(("post", 1, 0, 5), ("post", 2, -1, 5), ("post", 3, 1, 5),
              ("arrive", 10, 1, 5), ("arrive", 11, 1, 5), ("arrive", 12, 0, 5))
    assert got == [None, None, None, 2, 3, 1]


def test_tags_are_matched_apart_and_in_order_per_tag():
    got = run(("arrive", 10, 0, 1), ("arrive", 11, 0, 2), ("arrive", 12, 0, 1),
              ("post", 1, 0, 2), ("post", 2, 0, 1), ("post", 3, 0, 1), ("post", 4, 0, 3))
    assert got == [None, None, None, 11, 10, 12, None]


def test_any_source_takes_the_oldest_kept_message_with_its_tag():
    got = run(("arrive", 10, 2, 7), ("arrive", 11, 1, 7), ("arrive", 12, 1, 8),
              ("post", 1, -1, 8), ("post", 2, -1, 7), ("post", 3, -1, 7), ("post", 4, -1, 7))
    assert got == [None, None, None, 12, 10, 11, None]


def test_a_message_from_another_source_is_kept():
    got = run(("post", 1, 3, 0), ("arrive", 10, 2, 0), ("post", 2, 2, 0), ("arrive", 11, 3, 0))
    assert got == [None, None, 10, 1]


def test_cancelled_receive_matches_nothing():
    got = run(("post", 1, 0, 0), ("cancel", 1, 0, 0), ("cancel", 1, 0, 0), ("arrive", 10, 0, 0),
              ("post", 2, 0, 0))
    assert got == [None, 1, None, None, 10]


def test_dropped_message_is_not_taken():
    # a message of a sender that died half-way is dropped: a receive from any
    # source takes the next one
    got = run(("arrive", 10, 1, 0), ("arrive", 11, 2, 0), ("drop", 10, 0, 0), ("drop", 10, 0, 0),
              ("post", 1, -1, 0))
    assert got == [None, None, 10, None, 11]


def test_spare_buffers_keep_early_messages_buffers_warm():
    """p2p/spare_buffers.h: a message that arrives before its receive gets a
    kept buffer when one fits (not more than twice its size), a new one
    otherwise; what is given back is kept up to the cap, smallest dropped
    first."""
    from fairring_py import _C

    mib = 1 << 20
    out = _C._spare_buffers_for_test(64 * mib, [
        ("take", 0, 25 * mib), ("give", 0, 0),   # 0, 1: kept, 25 MiB
        ("take", 1, 25 * mib),                   # 2: the same buffer again (0 kept)
        ("take", 2, 10 * mib), ("give", 2, 0),   # 3, 4: a new one, kept (10)
        ("take", 3, 4 * mib),                    # 5: 10 MiB is more than twice 4: a new one
        ("give", 1, 0), ("give", 3, 0),          # 6, 7: 35, then 39 kept
        ("take", 4, 30 * mib), ("give", 4, 0),   # 8, 9: new; 39 + 30 > 64: the 4, then the 10 go (55)
        ("take", 5, 100 * mib), ("give", 5, 0),  # 10, 11: larger than the cap: never kept
    ])
    assert out[2][:2] == (0, 25 * mib) and out[2][2] == 0
    assert out[3][0] == -1 and out[4][2] == 10 * mib
    assert out[5][:2] == (-1, 4 * mib)
    assert out[6][2] == 35 * mib and out[7][2] == 39 * mib
    assert out[8][0] == -1 and out[9][2] == 55 * mib
    assert out[10][0] == -1 and out[11][2] == 55 * mib
