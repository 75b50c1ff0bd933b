"""The source folders are layers (docs/ARCHITECTURE.md): a file includes only
its own folder and folders of lower layers, never one above it or beside it.
Read from the sources: a new include that points up or sideways fails here."""
from __future__ import annotations

import pathlib
import re

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"

# Higher numbers sit above lower ones; folders of one number are siblings.
LAYERS = {
    "backend": 6, "testing": 6,      # the c10d glue and the Python bindings; test hooks
    "collectives": 5,                # one file per collective: its script over the primitives
    "devices": 4, "p2p": 4,          # the CPU and CUDA engines: the core with a mover and rails; send/recv
    "pipeline": 3, "servers": 3,     # the pipeline core and the slice primitives; the reduction server
    "node": 2, "rails": 2,           # the node protocol (shared memory); the rail exchanges
    "plan": 1, "transport": 1, "kernels": 1, "topology": 1,
    "common": 0,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)


def test_every_source_folder_is_a_known_layer():
    folders = {p.name for p in CSRC.iterdir() if p.is_dir()}
    assert folders == set(LAYERS), f"folders without a layer: {folders - set(LAYERS)}; gone: {set(LAYERS) - folders}"


def test_includes_point_only_down():
    bad = []
    for path in sorted(CSRC.rglob("*")):
        if path.suffix not in {".h", ".cpp", ".cu", ".cuh"}:
            continue
        here = path.relative_to(CSRC).parts[0]
        for folder in INCLUDE.findall(path.read_text()):
            if folder != here and LAYERS[folder] >= LAYERS[here]:
                bad.append(f"{path.relative_to(CSRC)} includes {folder}/ "
                           f"(layer {LAYERS[folder]} from layer {LAYERS[here]})")
    assert not bad, "includes that point up or sideways:\n" + "\n".join(bad)
