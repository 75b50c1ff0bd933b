"""The simulated clusters the collective tests run on (node ids per rank, and
the environment): one node and several, nodes of one rank, uneven nodes,
slices of 4 KiB (many slices per op) and the device-like mover."""
from __future__ import annotations

TOPOLOGIES = {
    "1x1": (["a"], {}),
    "1x2": (["a", "a"], {}),
    "1x3": (["a", "a", "a"], {}),
    "2x1": (["a", "b"], {}),
    "2x2": (["a", "a", "b", "b"], {}),
    "3x1": (["a", "b", "c"], {}),
    "uneven-2+1": (["a", "a", "b"], {}),
    # Interleaved nodes of 3 and 2 ranks: two rails, rank 4 passive.
    "uneven-3+2": (["a", "b", "a", "b", "a"], {}),
    "2x2-slice4K": (["a", "a", "b", "b"], {"FAIRRING_SLICE_SIZE": "4K", "FAIRRING_PARALLELISM": "2",
                                          "FAIRRING_TOTAL_MEMORY": "1M"}),
    "2x2-deferred": (["a", "a", "b", "b"], {"FAIRRING_TEST_DEFERRED_MOVER": "1"}),
    # A node of one beside a node of three: one rail carrying two passive ranks'
    # pieces, under the device-like mover, many slices in flight.
    "uneven-1+3-deferred": (["a", "b", "b", "b"], {"FAIRRING_TEST_DEFERRED_MOVER": "1", "FAIRRING_SLICE_SIZE": "4K",
                                                  "FAIRRING_PARALLELISM": "2", "FAIRRING_TOTAL_MEMORY": "1M"}),
}
