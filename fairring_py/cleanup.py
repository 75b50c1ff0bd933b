"""Removes what crashed Fairring jobs left in /dev/shm.

    python -m fairring_py.cleanup

A group's shared-memory segment loses its name once every rank of the node has
mapped it, so from then on it goes with the last process, however that ends.
A job killed before that (every rank SIGKILLed during group creation) leaves
the named segment behind. This removes this user's ``fairring-*`` segments whose
creating process has exited and that are over a minute old (a younger one may
belong to a group being created in a pid namespace this process cannot see).
The same sweep runs at ``import fairring_py`` and before a node creates a segment.
"""
import sys

from . import _C


def main() -> int:
    n = _C._sweep_stale_segments()
    print(f"fairring: removed {n} stale shared memory segment(s) from /dev/shm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
