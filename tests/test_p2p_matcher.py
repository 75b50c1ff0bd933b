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
