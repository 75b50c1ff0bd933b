"""The engine's one exception type (csrc/common/error.h) as users meet it:
each kind becomes torch's type at the binding, the store's timeout is a
DistStoreError, and every collective's own words reach the messages."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from fairring_py import _C

import launch


@pytest.mark.parametrize("kind,expected", [
    ("backend", dist.DistBackendError),
    ("network", dist.DistNetworkError),
    ("store", dist.DistStoreError),
    ("argument", ValueError),
])
def test_each_kind_raises_torchs_type(kind, expected):
    with pytest.raises(expected, match="the message") as info:
        _C._raise_for_test(kind, "the message")
    # The Dist errors stay distinguishable: a network error is not reported
    # as a plain backend error, nor the other way round.
    others = {dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError} - {expected}
    assert not any(type(info.value) is o for o in others), type(info.value)


def test_store_timeout_at_group_creation_is_a_dist_store_error():
    """Rank 1 of 2 reaches a creation checkpoint that rank 0 never does:
    after the timeout it raises DistStoreError naming what it waited for."""
    store = dist.TCPStore("127.0.0.1", launch.free_port(), 2, True, timeout=timedelta(seconds=10),
                          wait_for_workers=False)
    with pytest.raises(dist.DistStoreError, match=r"Timed out creating the process group: rank 1 waited .* for "):
        _C._init_checkpoint(store, 1, 2, timedelta(milliseconds=300), "built")


@pytest.mark.parametrize("record", [b"", b"12:abc", b"x:abc", b"3:abc", b"1:a1:b1:c", b"1234567890123:a"])
def test_malformed_creation_record_names_the_rank(record):
    """A peer's record in the store that does not parse (truncated, a length
    that is no number, too few fields, a length of over 12 digits: another
    job's keys under this prefix, say) fails creation with a message naming
    that rank, not an out-of-range read.  Rank 1 is played by the test: its
    checkpoint key and its record written by hand."""
    store = dist.HashStore()
    store.set("fairring/options/1", b"\x01")
    store.set("fairring/meet/1", record)
    config = _C.Config()
    config.timeout = timedelta(milliseconds=300)  # how long rank 0 waits for rank 1 to read its failure
    with pytest.raises(dist.DistBackendError, match="malformed group-creation record of rank 1 in the store"):
        _C.FairringBackend(store, 0, 2, config, "node-a", None)


@pytest.mark.parametrize("collective,text", [
    ("all_reduce", "all_reduce of 1000 elements of float32 with SUM"),
    ("reduce_scatter", "reduce_scatter of 1000 elements of float32 per rank with SUM"),
    ("all_gather", "all_gather of 1000 elements of float32 per rank"),
    ("broadcast", "broadcast of 1000 bytes from rank 1"),
    ("reduce", "reduce of 1000 elements of float32 with SUM to rank 1"),
    ("barrier", "barrier"),
])
def test_each_collective_describes_itself(collective, text):
    """The words come from each collective's own file (registered when the
    library loads), so a mismatch names every kind, a peer's included."""
    assert _C._describe_for_test(collective, 1000, 1) == text
